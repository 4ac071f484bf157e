"""CgroupPolicy files: YAML in, a flat list of desired groups out.

    apiVersion: xh.scheduling/v1
    kind: CgroupPolicy
    metadata: {name: io-classes}
    spec:
      groups:
        - name: latency-critical
          io: {weight: 500, devices: {nvme0n1: 800}}
          children: [{name: web}]

Every field maps onto one registry file (registry.BY_POLICY); `io.devices` adds
per-device lines to io.weight and `io.max` is per device. Errors are FILE:LINE:COL.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..spec import Cursor, SpecError, load_file, load_text
from . import registry as R
from . import values as v
from .io_weight import resolve_device
from .subtree import check_name

API_VERSION = "xh.scheduling/v1"
KIND = "CgroupPolicy"
EXTRA_FIELDS = {"io": ("devices",)}  # per-device io.weight lines
IO_MAX_KEYS = ("rbps", "wbps", "riops", "wiops")
GROUP_FIELDS = ("name", *R.POLICY_SECTIONS, "children")
WHAT = {"weight": "weight (1..10000)", "max": "limit", "cpus": "cpu list", "mems": "node list"}


@dataclass
class GroupSpec:
    path: str  # relative to the agent's subtree: "latency-critical/web"
    settings: dict[str, Any] = field(default_factory=dict)  # registry file name -> canonical value
    where: dict[str, str] = field(default_factory=dict)  # file name -> "FILE:LINE:COL"
    devices: dict[str, str] = field(default_factory=dict)  # MAJ:MIN -> name the policy used

    @property
    def depth(self) -> int:
        return self.path.count("/") + 1


@dataclass
class Policy:
    name: str
    file: str
    groups: list[GroupSpec]  # parents before children

    def controllers(self) -> dict[str, list[str]]:
        """controller -> groups whose settings need it."""
        need: dict[str, list[str]] = {}
        for g in self.groups:
            for controller in dict.fromkeys(R.BY_NAME[name].controller for name in g.settings):
                need.setdefault(controller, []).append(g.path)
        return need


def load_policy(path: str | Path, sys_root: Path = Path("/sys")) -> Policy:
    return _one(load_file(path), str(path), sys_root)


def load_policy_text(text: str, file: str = "<string>", sys_root: Path = Path("/sys")) -> Policy:
    return _one(load_text(text, file), file, sys_root)


def _one(docs, file: str, sys_root: Path) -> Policy:
    policies = [d for d in docs if isinstance(d.value, dict) and d.value.get("kind") == KIND]
    if len(policies) != 1:
        where = docs[0].root if docs else None
        msg = f"expected exactly one {KIND} document, found {len(policies)}"
        raise where.error(msg) if where else SpecError(file, 1, 1, msg)
    root = policies[0].root.mapping({"apiVersion", "kind", "metadata", "spec"},
                                    required={"apiVersion", "kind", "spec"})
    root["apiVersion"].str([API_VERSION])
    name = root["metadata"].mapping({"name", "labels", "annotations"})["name"].str(default="") \
        if root["metadata"].present else ""
    groups: list[GroupSpec] = []
    for item in root["spec"].mapping({"groups"}, required={"groups"})["groups"].seq():
        _group(item, "", groups, sys_root)
    return Policy(name, file, groups)


def _loc(c: Cursor) -> str:
    line, col = c.doc.position(c.path)
    return f"{c.doc.file}:{line}:{col}"


def _group(c: Cursor, parent: str, out: list[GroupSpec], sys_root: Path) -> None:
    c.mapping(GROUP_FIELDS, required={"name"})
    name = c["name"].parse(check_name, "group name")
    path = f"{parent}/{name}" if parent else name
    if any(g.path == path for g in out):
        raise c["name"].error(f"group {path!r} is declared twice")
    spec = GroupSpec(path)
    out.append(spec)
    for section in R.POLICY_SECTIONS:
        if not c[section].present:
            continue
        sec = c[section].mapping([*R.POLICY_SECTIONS[section], *EXTRA_FIELDS.get(section, ())])
        for fld, value in sec.items():
            if fld in EXTRA_FIELDS.get(section, ()):
                continue
            f = R.BY_POLICY[(section, fld)]
            if f is R.IO_WEIGHT:
                spec.settings.setdefault(f.name, {})["default"] = value.parse(v.weight, WHAT["weight"])
            elif f is R.IO_MAX:
                spec.settings[f.name] = _per_device(value, spec, _io_limits, sys_root)
            else:
                spec.settings[f.name] = value.parse(f.validate, WHAT.get(fld, fld))
            spec.where[f.name] = _loc(value)
        if section == "io" and sec["devices"].present:
            spec.settings.setdefault(R.IO_WEIGHT.name, {}).update(
                _per_device(sec["devices"], spec, lambda w: w.parse(v.weight, WHAT["weight"]), sys_root))
            spec.where.setdefault(R.IO_WEIGHT.name, _loc(sec["devices"]))
    _check_burst(c, spec)
    for child in c["children"].seq(default=[]):
        _group(child, path, out, sys_root)


def _per_device(c: Cursor, spec: GroupSpec, value_of: Callable[[Cursor], Any], sys_root: Path) -> dict[str, Any]:
    out = {}
    for dev, value in c.items():
        majmin = _device(c, str(dev), sys_root)
        spec.devices[majmin] = str(dev)
        out[majmin] = value_of(value)
    return out


def _device(c: Cursor, dev: str, sys_root: Path) -> str:
    try:
        return resolve_device(dev, sys_root)
    except ValueError as exc:
        pos = c.doc.positions.get((*c.path, dev, "<key>")) or c.doc.position(c.path)
        raise SpecError(c.doc.file, *pos, f"{c.where}: {exc}") from None


def _io_limits(c: Cursor) -> dict[str, Any]:
    c.mapping(IO_MAX_KEYS)
    return {k: c[k].parse(_IO_MAX_PARSERS[k], "size" if k.endswith("bps") else "count")
            for k in IO_MAX_KEYS if c[k].present}


def _bps(value: Any) -> int | str:
    return v.bytes_or_max(value, page_round=False)


_IO_MAX_PARSERS = {"rbps": _bps, "wbps": _bps, "riops": v.count_or_max, "wiops": v.count_or_max}


def _check_burst(c: Cursor, spec: GroupSpec) -> None:
    burst, quota = spec.settings.get(R.CPU_MAX_BURST.name), spec.settings.get(R.CPU_MAX.name)
    if burst and quota and quota[0] != v.MAX and burst > quota[0]:
        raise c["cpu"]["max.burst"].error(f"cpu.max.burst {burst} exceeds the cpu.max quota {quota[0]} (the kernel refuses it)")
