"""CgroupPolicy files: YAML in, a flat list of desired groups out.

    apiVersion: xh.scheduling/v1
    kind: CgroupPolicy
    metadata: {name: io-classes}
    spec:
      groups:
        - name: latency-critical
          io: {weight: 500, devices: {nvme0n1: 800}}
          children: [{name: web}]
      classes:                      # the agent's task classes (Task spec.class)
        - {name: latency, cpu: {weight: 1000}, io: {weight: 1000}}
      ioCost:                       # the cgroup2 root's io.cost.model and io.cost.qos
        nullb0:
          model: {ctrl: user, model: linear, rbps: 8000000, rseqiops: 2000, ...}
          qos: {enable: 1, ctrl: user, rpct: 95, rlat: 5000, wpct: 95, wlat: 5000, ...}

Every field maps onto one registry file (registry.BY_POLICY); `io.devices` adds
per-device lines to io.weight and `io.max` is per device. Errors are FILE:LINE:COL, all of
a file's at once. A device this node does not have is not an error in the file: the policy
keeps it in `absent` and `plan` refuses it as unsupported here. `classes` give the agent's
task classes their cpu.weight and io.weight (100 each when not given). `ioCost` gives a
device's io.cost model and QoS, written to the root's io.cost.model and io.cost.qos (keys as
the kernel names them, Documentation/admin-guide/cgroup-v2.rst); its devices resolve as
io.devices do. A file holds groups, classes, ioCost or any of them together.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..spec import Cursor, Document, SpecError, load_file, load_text
from . import registry, values
from .io_weight import NoSuchDevice, resolve_device
from .subtree import check_name

API_VERSION = "xh.scheduling/v1"
KIND = "CgroupPolicy"
EXTRA_FIELDS = {"io": ("devices",)}  # per-device io.weight lines
IO_MAX_KEYS = ("rbps", "wbps", "riops", "wiops")
GROUP_FIELDS = ("name", *registry.POLICY_SECTIONS, "children")
# The keys each mapping of the file allows and requires (read here, described by `xhagent crd`).
HEADER_FIELDS, HEADER_REQUIRED = (
    ("apiVersion", "kind", "metadata", "spec"),
    ("apiVersion", "kind", "spec"),
)
METADATA_FIELDS = ("name", "labels", "annotations")
SPEC_FIELDS = ("groups", "classes", "ioCost")  # at least one of them
IO_COST_FIELDS = ("model", "qos")  # per device; at least one
U64 = values.int_range(0, 2**63 - 1)  # the kernel takes u64; a CRD's integers are int64
CTRL = values.choice("user", "auto")
# spec.ioCost.DEV.model: io.cost.model's keys; with numbers, all six (the kernel would keep
# the ones not given from whatever model the device had).
IO_COST_MODEL_KEYS = {
    "ctrl": CTRL,
    "model": values.choice("linear"),
    **{k: U64 for k in ("rbps", "rseqiops", "rrandiops", "wbps", "wseqiops", "wrandiops")},
}
IO_COST_MODEL_NUMBERS = tuple(IO_COST_MODEL_KEYS)[2:]
# spec.ioCost.DEV.qos: io.cost.qos's keys; percentiles 0..100, latencies in µs, the vrate
# bounds min/max in percent (the kernel clamps them to 1..10000).
IO_COST_QOS_KEYS = {
    "enable": values.boolean01,
    "ctrl": CTRL,
    "rpct": values.decimal(0, 100),
    "rlat": U64,
    "wpct": values.decimal(0, 100),
    "wlat": U64,
    "min": values.decimal(1, 10000),
    "max": values.decimal(1, 10000),
}
IO_COST_QOS_NUMBERS = tuple(IO_COST_QOS_KEYS)[2:]
IO_COST_WHAT = {
    "ctrl": "ctrl",
    "model": "model",
    "enable": "enable (0 or 1)",
    "rbps": "rate in bytes per second",
    "wbps": "rate in bytes per second",
    "rpct": "percentile",
    "wpct": "percentile",
    "rlat": "latency in µs",
    "wlat": "latency in µs",
    "min": "percentage",
    "max": "percentage",
}
CLASS_FIELDS, CLASS_SECTIONS = ("name", "cpu", "io"), ("cpu", "io")
WHAT = {"weight": "weight (1..10000)", "max": "limit", "cpus": "cpu list", "mems": "node list"}
MAX_NESTING = 32  # levels of groups in one policy; deeper is a mistake (and recursion)
CLASS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DEFAULT_WEIGHT = 100  # the kernel's


@dataclass
class GroupSpec:
    path: str  # relative to the agent's subtree: "latency-critical/web"
    settings: dict[str, Any] = field(default_factory=dict)  # registry file name -> canonical value
    where: dict[str, str] = field(default_factory=dict)  # file name -> "FILE:LINE:COL"
    devices: dict[str, str] = field(default_factory=dict)  # MAJ:MIN -> name the policy used
    at: str = ""  # FILE:LINE:COL of its name

    @property
    def depth(self) -> int:
        return self.path.count("/") + 1


@dataclass
class IoCostSpec:
    """One device's io.cost settings: what the root's io.cost.model and io.cost.qos get."""

    device: str  # the name the policy used
    model: dict[str, Any] = field(default_factory=dict)  # key -> canonical value; {}: not set
    qos: dict[str, Any] = field(default_factory=dict)
    at: str = ""  # FILE:LINE:COL of the device's key


@dataclass
class CgroupPolicy:
    name: str
    file: str
    groups: list[GroupSpec]  # parents before children
    absent: list[str] = field(default_factory=list)  # "FILE:LINE:COL: devices this node lacks"
    classes: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> cpu, io weight
    io_cost: dict[str, IoCostSpec] = field(default_factory=dict)  # MAJ:MIN -> its settings
    io_cost_at: str = ""  # FILE:LINE:COL of spec.ioCost

    def controllers(self) -> dict[str, list[str]]:
        """controller -> groups whose settings need it."""
        need: dict[str, list[str]] = {}
        for g in self.groups:
            for controller in dict.fromkeys(
                registry.BY_NAME[name].controller for name in g.settings
            ):
                need.setdefault(controller, []).append(g.path)
        return need


def load_policy(path: str | Path, sys_root: Path = Path("/sys")) -> CgroupPolicy:
    return _one(load_file(path), str(path), sys_root)


def load_policy_text(
    text: str, file: str = "<string>", sys_root: Path = Path("/sys")
) -> CgroupPolicy:
    return _one(load_text(text, file), file, sys_root)


def _one(docs: list[Document], file: str, sys_root: Path) -> CgroupPolicy:
    policies = [d for d in docs if isinstance(d.value, dict) and d.value.get("kind") == KIND]
    if len(policies) != 1:
        where = docs[0].root if docs else None
        msg = f"expected exactly one {KIND} document, found {len(policies)}"
        raise where.error(msg) if where else SpecError(file, 1, 1, msg)
    doc = policies[0]
    root = doc.root
    if not root.fields(HEADER_FIELDS, required=HEADER_REQUIRED):
        doc.errors.raise_if_any()
    doc.attempt(lambda: root["apiVersion"].str([API_VERSION]))
    meta = root["metadata"]
    name = ""
    if meta.present and meta.fields(METADATA_FIELDS):
        name = doc.attempt(lambda: meta["name"].str(default=""), "")
    policy = CgroupPolicy(name, file, [])
    spec = root["spec"]
    items, classes = [], []
    if doc.attempt(lambda: spec.mapping(SPEC_FIELDS), None) is not None:
        if not any(spec[k].present for k in SPEC_FIELDS):
            doc.errors.add(spec.error("spec: expected groups, classes, ioCost or several"))
        items = doc.attempt(lambda: spec["groups"].seq(default=[]), [])
        classes = doc.attempt(lambda: spec["classes"].seq(default=[]), [])
    for item in items:
        _group(item, "", policy, sys_root, 1)
    for item in classes:
        _class(item, policy)
    if spec.present and isinstance(spec.value, dict) and spec["ioCost"].present:
        with doc.collecting():
            _io_cost(spec["ioCost"], policy, sys_root)
    doc.errors.raise_if_any()
    return policy


def _class(c: Cursor, policy: CgroupPolicy) -> None:
    """A task class: its name (a DNS-1123 label, as Task spec.class) and weights."""
    if not c.fields(CLASS_FIELDS, required={"name"}):
        return
    name = c.doc.attempt(lambda: _class_name(c["name"], policy))
    weights = []
    for section in CLASS_SECTIONS:
        sec = c[section]
        weight = DEFAULT_WEIGHT
        if sec.present and sec.fields({"weight"}) and sec["weight"].present:
            weight = c.doc.attempt(lambda s=sec: s["weight"].parse(values.weight, WHAT["weight"]))
        weights.append(weight)
    if name is not None:
        policy.classes[name] = (weights[0], weights[1])


def _class_name(c: Cursor, policy: CgroupPolicy) -> str:
    name = c.str()
    if not CLASS_NAME.fullmatch(name):
        raise c.error(
            f"name: {name!r} is not a class name (lowercase letters, digits and '-', "
            "at most 63, starting and ending with a letter or digit)"
        )
    if name in policy.classes:
        raise c.error(f"class {name!r} is declared twice")
    return name


def _loc(c: Cursor) -> str:
    line, col = c.doc.position(c.path)
    return f"{c.doc.file}:{line}:{col}"


def _group(c: Cursor, parent: str, policy: CgroupPolicy, sys_root: Path, depth: int) -> None:
    """One group and its children; each field's error is collected and the rest still read."""
    out = policy.groups
    if not c.fields(GROUP_FIELDS, required={"name"}):
        return  # not a mapping: nothing more to read in it
    name = None
    with c.doc.collecting():
        name = c["name"].parse(check_name, "group name")
    path = f"{parent}/{name}" if parent else (name or "")
    spec = GroupSpec(path, at=_loc(c["name"]))
    if name is not None:
        with c.doc.collecting():
            if any(g.path == path for g in out):
                raise c["name"].error(f"group {path!r} is declared twice")
            out.append(spec)
    for section in registry.POLICY_SECTIONS:
        if c[section].present:
            with c.doc.collecting():
                _section(c, section, spec, policy, sys_root)
    with c.doc.collecting():
        _check_burst(c, spec)
    children: list[Cursor] = []
    with c.doc.collecting():
        children = c["children"].seq(default=[])
        if children and depth >= MAX_NESTING:
            children = []
            raise c["children"].error(f"groups nest deeper than {MAX_NESTING} levels")
    for child in children:
        _group(child, path if name is not None else f"{parent}/?", policy, sys_root, depth + 1)


def _section(
    c: Cursor, section: str, spec: GroupSpec, policy: CgroupPolicy, sys_root: Path
) -> None:
    sec = c[section]
    if not sec.fields((*registry.POLICY_SECTIONS[section], *EXTRA_FIELDS.get(section, ()))):
        return
    for fld, value in sec.items():
        if fld in EXTRA_FIELDS.get(section, ()) or fld not in registry.POLICY_SECTIONS[section]:
            continue
        f = registry.BY_POLICY[(section, fld)]
        with c.doc.collecting():
            if f is registry.IO_WEIGHT:
                spec.settings.setdefault(f.name, {})["default"] = value.parse(
                    values.weight, WHAT["weight"]
                )
            elif f is registry.IO_MAX:
                spec.settings[f.name] = _per_device(value, spec, policy, _io_limits, sys_root)
            else:
                spec.settings[f.name] = value.parse(f.validate, WHAT.get(fld, fld))
            spec.where[f.name] = _loc(value)
    if section == "io" and sec["devices"].present:
        with c.doc.collecting():
            spec.settings.setdefault(registry.IO_WEIGHT.name, {}).update(
                _per_device(
                    sec["devices"],
                    spec,
                    policy,
                    lambda w: w.parse(values.weight, WHAT["weight"]),
                    sys_root,
                )
            )
            spec.where.setdefault(registry.IO_WEIGHT.name, _loc(sec["devices"]))


def _per_device(
    c: Cursor,
    spec: GroupSpec,
    policy: CgroupPolicy,
    value_of: Callable[[Cursor], Any],
    sys_root: Path,
) -> dict[str, Any]:
    out = {}
    for dev, value in c.items():
        with c.doc.collecting():
            parsed = value_of(value)  # checked even for a device this node lacks
            majmin = _device(c, dev, policy, sys_root)
            if majmin is not None:
                spec.devices[majmin] = str(dev)
                out[majmin] = parsed
    return out


def _device(c: Cursor, dev: object, policy: CgroupPolicy, sys_root: Path) -> str | None:
    """MAJ:MIN of `dev`; None, noted in `policy.absent`, for a device this node lacks (the file
    is fine: the node is not); a name that cannot be a device is a file error."""
    pos = c.doc.positions.get((*c.path, dev, "<key>")) or c.doc.position(c.path)
    if not isinstance(dev, str):
        # YAML 1.1 reads an unquoted 252:0 as the base-60 number 15120
        raise SpecError(
            c.doc.file,
            *pos,
            f"{c.where}: device {dev!r} is a number, not a name: YAML reads an unquoted "
            f'MAJ:MIN such as 252:0 as a base-60 number; quote it ("252:0")',
        )
    try:
        return resolve_device(dev, sys_root)
    except NoSuchDevice as exc:
        policy.absent.append(f"{c.doc.file}:{pos[0]}:{pos[1]}: {c.where}: {exc}")
        return None
    except ValueError as exc:
        raise SpecError(c.doc.file, *pos, f"{c.where}: {exc}") from None


def _io_cost(c: Cursor, policy: CgroupPolicy, sys_root: Path) -> None:
    """spec.ioCost: {DEV: {model: {...}, qos: {...}}}; every device's errors collected."""
    policy.io_cost_at = _loc(c)
    for dev, entry in c.items():
        with c.doc.collecting():
            if not entry.fields(IO_COST_FIELDS):
                continue
            if not any(entry[k].present for k in IO_COST_FIELDS):
                raise entry.error(f"{entry.where}: expected model, qos or both")
            model = _io_cost_keys(entry["model"], IO_COST_MODEL_KEYS)
            qos = _io_cost_keys(entry["qos"], IO_COST_QOS_KEYS)
            with c.doc.collecting():
                _check_model(entry["model"], model)
            with c.doc.collecting():
                _check_qos(entry["qos"], qos)
            majmin = _device(c, dev, policy, sys_root)
            if majmin is None:
                continue
            at = c.doc.positions.get((*c.path, dev, "<key>")) or c.doc.position(c.path)
            if majmin in policy.io_cost:
                raise SpecError(
                    c.doc.file,
                    *at,
                    f"{c.where}: {dev} is {majmin}, "
                    f"given already as {policy.io_cost[majmin].device}",
                )
            policy.io_cost[majmin] = IoCostSpec(
                str(dev), model, qos, f"{c.doc.file}:{at[0]}:{at[1]}"
            )


def _io_cost_keys(c: Cursor, keys: dict[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """The keys of an io.cost.model or io.cost.qos mapping, in the kernel's order."""
    out: dict[str, Any] = {}
    if not c.present or not c.fields(keys):
        return out
    if not c.value:
        c.doc.errors.add(c.error(f"{c.where}: expected at least one of {', '.join(keys)}"))
    for k, check in keys.items():
        if c[k].present:
            with c.doc.collecting():
                out[k] = c[k].parse(check, IO_COST_WHAT.get(k, "IOPS figure"))
    return out


def _check_model(c: Cursor, model: dict[str, Any]) -> None:
    if not isinstance(c.value, dict):
        return
    numbers = [k for k in IO_COST_MODEL_NUMBERS if k in c.value]
    if not numbers:
        return
    if c.value.get("ctrl") == "auto":
        raise c["ctrl"].error(
            f"{c.where}: ctrl auto takes no {', '.join(numbers)} (the kernel would switch to user)"
        )
    missing = [k for k in IO_COST_MODEL_NUMBERS if k not in c.value]
    if missing:
        raise c.error(
            f"{c.where}: a user model needs all of {', '.join(IO_COST_MODEL_NUMBERS)}; "
            f"missing {', '.join(missing)}"
        )


def _check_qos(c: Cursor, qos: dict[str, Any]) -> None:
    if not isinstance(c.value, dict):
        return
    numbers = [k for k in IO_COST_QOS_NUMBERS if k in c.value]
    if numbers and c.value.get("ctrl") == "auto":
        raise c["ctrl"].error(
            f"{c.where}: ctrl auto takes no {', '.join(numbers)} (the kernel would switch to user)"
        )
    if "min" in qos and "max" in qos and qos["min"] > qos["max"]:
        raise c["min"].error(f"{c.where}: min {qos['min']:g} exceeds max {qos['max']:g}")


def _io_limits(c: Cursor) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not c.fields(IO_MAX_KEYS):
        return out
    for k in IO_MAX_KEYS:
        if c[k].present:
            with c.doc.collecting():
                out[k] = c[k].parse(IO_MAX_PARSERS[k], "size" if k.endswith("bps") else "count")
    return out


def _bps(value: Any) -> int | str:
    return values.bytes_or_max(value, page_round=False)


_bps.schema = values.bytes_or_max.schema
IO_MAX_PARSERS = {
    "rbps": _bps,
    "wbps": _bps,
    "riops": values.count_or_max,
    "wiops": values.count_or_max,
}


def _check_burst(c: Cursor, spec: GroupSpec) -> None:
    burst, quota = (
        spec.settings.get(registry.CPU_MAX_BURST.name),
        spec.settings.get(registry.CPU_MAX.name),
    )
    if burst and quota and quota[0] != values.MAX and burst > quota[0]:
        raise c["cpu"]["max.burst"].error(
            f"cpu.max.burst {burst} exceeds the cpu.max quota {quota[0]} (the kernel refuses it)"
        )
