"""Desired tree (a CgroupPolicy) against actual tree (read from the kernel) -> ordered actions.

The planner is pure: it sees the kernel only through an `Actual` snapshot, so plans and
their ordering are tested on plain data. Order of a plan:

1. create missing groups, parents first;
2. enable controllers in `cgroup.subtree_control` top-down; a group holding processes
   first has them moved into a leaf child when a domain controller is enabled below it
   (no internal processes);
3. write the policy's io.cost model, then its QoS (spec.ioCost), to the cgroup2 root, and
   switch io.cost on for devices that get per-device weights (only when allowed);
4. writes that loosen a limit (or are neutral, like weights) top-down, then writes that
   tighten one bottom-up; within a group, registry `order` breaks ties (cpu.max before
   cpu.max.burst when loosening, after it when tightening);
5. with prune, remove undeclared groups bottom-up, only when empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import io_weight, registry, values
from .policy import CgroupPolicy

ROOT = "/"  # the cgroup2 root itself, outside the subtree: only enable, io-cost and the
# io.cost.model / io.cost.qos writes of spec.ioCost go there
SUBTREE = ""  # the subtree's own directory
PATH_MAX = 4096  # bytes of a path the kernel takes, its NUL included
LONGEST_FILE = (
    32  # room for the longest interface file name below a group ("/cgroup.max.descendants")
)


@dataclass(frozen=True)
class Limit:
    """cgroup.max.depth and cgroup.max.descendants of the subtree or a group above it: mkdir
    below it fails with EAGAIN past them (None: max)."""

    levels_above: int  # 0: the subtree itself, 1: its parent, ...
    path: str
    max_depth: int | None = None
    max_descendants: int | None = None
    descendants: int = 0  # nr_descendants in its cgroup.stat


@dataclass
class ActualGroup:
    controllers: list[str] = field(default_factory=list)  # cgroup.controllers
    subtree_control: list[str] = field(default_factory=list)
    procs: list[int] = field(default_factory=list)
    populated: bool = False
    values: dict[str, Any] = field(default_factory=dict)  # registry file name -> parsed value


@dataclass
class Actual:
    """What the kernel has now, as far as a plan needs it."""

    root_controllers: list[str]  # offered by the cgroup2 root
    parent_subtree_control: list[str]  # of the subtree's parent: what is delegated to it
    groups: dict[str, ActualGroup]  # relative to the subtree; SUBTREE when it exists
    subtree_is_top_level: bool = True  # its parent is the cgroup2 root
    systemd_root: bool = False  # systemd manages the root: never write it
    io_cost_enabled: set[str] = field(default_factory=set)
    # The root's io.cost.model and io.cost.qos, parsed; a file absent here is absent there
    # (a kernel without io.cost).
    root_values: dict[str, Any] = field(default_factory=dict)
    schedulers: dict[str, str | None] = field(default_factory=dict)  # MAJ:MIN -> scheduler
    unsupported: set[str] = field(default_factory=set)  # registry files absent here
    mode: str = "unified"
    v1_controllers: tuple[str, ...] = ()
    subtree_path: str = ""  # absolute, for path lengths
    agent_leaf: str = ""  # a name no managed group may take at the top
    limits: list[Limit] = field(default_factory=list)


@dataclass(frozen=True)
class Options:
    own_root: bool = False  # may enable controllers in the cgroup2 root's subtree_control
    enable_io_cost: bool = False  # may write the root's io.cost.qos (and io.cost.model)
    prune: bool = False
    leaf: str = "leaf"  # where processes of an inner group are moved


@dataclass(frozen=True)
class Action:
    kind: str  # create | move-procs | enable | io-cost | write | delete
    group: str  # relative to the subtree; ROOT for the cgroup2 root
    file: str | None = None
    value: Any = None  # what is written (parsed form; registry formats it)
    old: Any = None
    phase: str = ""  # loosen | tighten, for writes

    def describe(self) -> str:
        where = "<cgroup2 root>" if self.group == ROOT else (self.group or "<subtree>")
        if self.kind == "write":
            return f"write {where} {self.file} = {_show(self.value)} (was {_show(self.old)}" + (
                f"; {self.phase})" if self.phase else ")"
            )
        if self.kind == "enable":
            return f"enable {where} +{' +'.join(self.value)}"
        if self.kind == "io-cost":
            return f"io-cost {self.value} enable=1"
        if self.kind == "move-procs":
            return f"move-procs {where} -> {self.value}"
        return f"{self.kind} {where}"

    def as_dict(self) -> dict[str, Any]:
        return {
            k: (list(v) if isinstance(v, tuple) else v)
            for k, v in self.__dict__.items()
            if k in ("kind", "group") or v not in (None, "")
        }


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    if isinstance(value, dict) and value and all(isinstance(x, dict) for x in value.values()):
        return "; ".join(values.format_nested_keyed(value))  # as the kernel reads: MAJ:MIN k=v ...
    return str(value)


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the plan must not be applied
    warnings: list[str] = field(default_factory=list)
    enforcers: dict[str, io_weight.Enforcer] = field(default_factory=dict)  # MAJ:MIN -> enforcer
    undeclared: list[str] = field(default_factory=list)  # groups present but not in the policy

    @property
    def writes(self) -> list[Action]:
        return [a for a in self.actions if a.kind == "write"]

    @property
    def drift(self) -> list[Action]:
        """Values of existing groups that differ from the policy."""
        return [a for a in self.writes if a.old is not None]


def plan(policy: CgroupPolicy, actual: Actual, options: Options = Options()) -> Plan:
    out = Plan()
    _check_support(policy, actual, out)
    _check_limits(policy, actual, out)
    if out.errors:
        return out
    if SUBTREE not in actual.groups:
        out.actions.append(Action("create", SUBTREE))
    out.actions += [Action("create", g.path) for g in policy.groups if g.path not in actual.groups]
    _controllers(policy, actual, options, out)
    _io_cost(policy, actual, options, out)
    desired = _io_enforcement(policy, actual, options, out)
    _writes(policy, desired, actual, out)
    _prune(policy, actual, options, out)
    if out.errors:
        out.actions = []  # a plan with errors is never applied, not even in part
    return out


def _check_support(policy: CgroupPolicy, actual: Actual, out: Plan) -> None:
    for controller, groups in policy.controllers().items():
        if controller not in actual.root_controllers:
            held = (
                " (held by a cgroup v1 hierarchy)"
                if controller in actual.v1_controllers
                or (controller == "io" and "blkio" in actual.v1_controllers)
                else ""
            )
            files = [
                f"{f} ({g.where[f]})"
                for g in policy.groups
                if g.path in groups
                for f in g.settings
                if registry.BY_NAME[f].controller == controller
            ]
            out.errors.append(
                f"controller {controller} is not available in cgroup2 on this node{held}; "
                f"cgroup2 offers [{' '.join(actual.root_controllers)}] (mode {actual.mode}); "
                f"the policy sets {', '.join(files)}"
            )
    for g in policy.groups:
        for name in g.settings:
            if (
                name in actual.unsupported
                and registry.BY_NAME[name].controller in actual.root_controllers
            ):
                out.errors.append(
                    f"{g.where.get(name, g.path)}: {name} is not supported by this kernel"
                )


def _check_limits(policy: CgroupPolicy, actual: Actual, out: Plan) -> None:
    """What would make `apply` fail half-way and can be known now: devices this node lacks,
    the kernel's depth and descendant limits, path lengths, names taken by the agent."""
    out.errors += [f"{a} (not on this node: unsupported here)" for a in policy.absent]
    new = [g for g in policy.groups if g.path not in actual.groups]
    new_subtree = SUBTREE not in actual.groups
    for lim in actual.limits:
        if lim.max_depth is not None:
            deep = next((g for g in new if lim.levels_above + g.depth > lim.max_depth), None)
            if deep is not None:
                out.errors.append(
                    f"{deep.at}: group {deep.path} would be {lim.levels_above + deep.depth} levels "
                    f"below {lim.path}, whose cgroup.max.depth is {lim.max_depth}"
                )
            elif new_subtree and lim.levels_above > lim.max_depth:
                out.errors.append(
                    f"the subtree {actual.subtree_path} would be {lim.levels_above} levels below "
                    f"{lim.path}, whose cgroup.max.depth is {lim.max_depth}"
                )
        if lim.max_descendants is not None:
            adding = len(new) + (1 if new_subtree and lim.levels_above > 0 else 0)
            if adding and lim.descendants + adding > lim.max_descendants:
                out.errors.append(
                    f"{adding} new groups below {lim.path} would make {lim.descendants + adding}; "
                    f"its cgroup.max.descendants is {lim.max_descendants}"
                )
    for g in new:
        length = len(f"{actual.subtree_path}/{g.path}".encode()) + LONGEST_FILE
        if actual.subtree_path and length >= PATH_MAX:
            out.errors.append(
                f"{g.at}: group {g.path}: its files' paths would be longer than the kernel's "
                f"PATH_MAX ({PATH_MAX} bytes)"
            )
        if actual.agent_leaf and g.path.split("/")[0] == actual.agent_leaf:
            out.errors.append(
                f"{g.at}: {actual.agent_leaf} holds the agent's own processes, not a managed group"
            )


def _ancestors(path: str) -> list[str]:
    """The subtree and every group above `path`, top-down (not `path` itself)."""
    parts = path.split("/")
    return [SUBTREE] + ["/".join(parts[:i]) for i in range(1, len(parts))]


def _controllers(policy: CgroupPolicy, actual: Actual, options: Options, out: Plan) -> None:
    need: dict[str, set[str]] = {}  # group -> controllers its subtree_control must hold
    for controller, groups in policy.controllers().items():
        for g in groups:
            for a in _ancestors(g):
                need.setdefault(a, set()).add(controller)
    delegated = need.get(SUBTREE, set()) - set(actual.parent_subtree_control)
    if delegated:
        if actual.subtree_is_top_level and options.own_root and not actual.systemd_root:
            out.actions.append(
                Action("enable", ROOT, registry.SUBTREE_CONTROL.name, tuple(sorted(delegated)))
            )
        else:
            why = (
                "systemd manages the cgroup2 root"
                if actual.systemd_root
                else "pass --own-root to enable them at the cgroup2 root"
                if actual.subtree_is_top_level
                else "the subtree's parent must delegate them"
            )
            out.errors.append(
                f"controllers {' '.join(sorted(delegated))} are not enabled for the subtree "
                f"(its parent's cgroup.subtree_control lacks them): {why}"
            )
            return
    for path in [SUBTREE, *(g.path for g in policy.groups)]:
        have = actual.groups.get(path, ActualGroup())
        missing = tuple(sorted(need.get(path, set()) - set(have.subtree_control)))
        if not missing:
            continue
        if have.procs and any(c not in registry.THREADED_CONTROLLERS for c in missing):
            leaf = f"{path}/{options.leaf}" if path else options.leaf
            out.actions.append(Action("move-procs", path, registry.PROCS.name, leaf))
        out.actions.append(Action("enable", path, registry.SUBTREE_CONTROL.name, missing))


def _may_write_root_io(actual: Actual, options: Options) -> bool:
    return options.enable_io_cost and not actual.systemd_root


def _io_cost(policy: CgroupPolicy, actual: Actual, options: Options, out: Plan) -> None:
    """spec.ioCost: the root's io.cost.model then io.cost.qos, only the devices whose keys
    differ from what the files read now."""
    if not policy.io_cost:
        return
    at = policy.io_cost_at
    missing = [f.name for f in registry.ROOT_IO_COST if f.name not in actual.root_values]
    if missing:
        why = (
            "the io controller is not in cgroup2 here"
            if "io" not in actual.root_controllers
            else "a kernel built without CONFIG_BLK_CGROUP_IOCOST"
        )
        out.errors.append(
            f"{at}: spec.ioCost: this node has no io.cost (the cgroup2 root has no "
            f"{' or '.join(missing)}: {why})"
        )
        return
    if not _may_write_root_io(actual, options):
        how = (
            "systemd manages the cgroup2 root"
            if actual.systemd_root
            else "pass --enable-io-cost where the agent owns the cgroup2 root"
        )
        out.errors.append(
            f"{at}: spec.ioCost needs the cgroup2 root's "
            f"{' and '.join(f.name for f in registry.ROOT_IO_COST)}: {how}"
        )
        return
    for f in registry.ROOT_IO_COST:
        have = actual.root_values[f.name]
        want = {
            dev: keys
            for dev, s in policy.io_cost.items()
            if (keys := s.model if f is registry.IO_COST_MODEL else s.qos)
            and not f.matches(have, {dev: keys})
        }
        if want:
            old = {dev: have[dev] for dev in want if dev in have} or None
            out.actions.append(Action("write", ROOT, f.name, want, old))


def _io_cost_planned(policy: CgroupPolicy, actual: Actual, options: Options) -> dict[str, int]:
    """MAJ:MIN -> the `enable` spec.ioCost gives it, where the plan writes the root."""
    if not _may_write_root_io(actual, options) or not all(
        f.name in actual.root_values for f in registry.ROOT_IO_COST
    ):
        return {}
    return {dev: s.qos["enable"] for dev, s in policy.io_cost.items() if "enable" in s.qos}


def _io_enforcement(
    policy: CgroupPolicy, actual: Actual, options: Options, out: Plan
) -> dict[str, dict[str, Any]]:
    """Desired settings per group, with per-device io weights kept only where something
    enforces them (io.cost, or BFQ through io.bfq.weight); the rest become warnings."""
    desired = {g.path: dict(g.settings) for g in policy.groups}
    may_enable = _may_write_root_io(actual, options)
    # spec.ioCost's qos.enable decides for its devices; --enable-io-cost for the others.
    planned = _io_cost_planned(policy, actual, options)
    cost_on = {d for d in actual.io_cost_enabled if planned.get(d, 1)}
    # Disks BFQ schedules get every group's default weight through io.bfq.weight.
    bfq_disks = sorted(
        d
        for d, sched in actual.schedulers.items()
        if sched == io_weight.BFQ and d not in cost_on and planned.get(d) != 1
    )
    named = {
        d
        for g in policy.groups
        for d in (g.settings.get(registry.IO_WEIGHT.name) or {})
        if d != "default"
    }
    if any(g.settings.get(registry.IO_WEIGHT.name) for g in policy.groups):
        for dev in bfq_disks:
            if dev not in named:  # named ones get their enforcer below, io.cost possibly planned
                out.enforcers[dev] = io_weight.enforcer(dev, cost_on, io_weight.BFQ)
    for g in policy.groups:
        weights = g.settings.get(registry.IO_WEIGHT.name)
        if not weights:
            continue
        bfq: dict[str, int] = {}
        for dev in (d for d in weights if d != "default"):
            if dev not in out.enforcers:
                enable = dev not in planned and may_enable and dev not in cost_on
                out.enforcers[dev] = io_weight.enforcer(
                    dev,
                    cost_on,
                    actual.schedulers.get(dev),
                    enable or planned.get(dev) == 1,
                    "spec.ioCost" if dev in planned else "",
                )
                if enable:
                    out.actions.append(Action("io-cost", ROOT, registry.IO_COST_QOS.name, dev))
            enf = out.enforcers[dev]
            if enf.name == io_weight.BFQ:
                bfq[dev] = io_weight.bfq_weight(weights[dev])
            if enf.name != io_weight.IO_COST:
                # The kernel refuses (EOPNOTSUPP) or ignores a per-device io.weight line here.
                desired[g.path][registry.IO_WEIGHT.name] = {
                    k: w for k, w in desired[g.path][registry.IO_WEIGHT.name].items() if k != dev
                }
            if enf.name == io_weight.NONE:
                out.warnings.append(
                    f"{g.where.get(registry.IO_WEIGHT.name, g.path)}: io weight {weights[dev]} for "
                    f"{g.devices.get(dev, dev)} ({dev}) is not applied: {enf.note}"
                )
        if (
            bfq or any(out.enforcers[d].name == io_weight.BFQ for d in bfq_disks)
        ) and registry.IO_BFQ_WEIGHT.name not in actual.unsupported:
            desired[g.path][registry.IO_BFQ_WEIGHT.name] = {
                "default": io_weight.bfq_weight(weights.get("default", 100)),
                **bfq,
            }
    return desired


def _writes(
    policy: CgroupPolicy, desired: dict[str, dict[str, Any]], actual: Actual, out: Plan
) -> None:
    loosen, tighten = [], []
    for g in policy.groups:
        have = actual.groups.get(g.path)
        for name, want in desired[g.path].items():
            f = registry.BY_NAME[name]
            old = have.values.get(name) if have else None
            if old is not None and f.matches(old, want):
                continue
            if isinstance(want, dict) and isinstance(
                old, dict
            ):  # keyed files: only the entries that differ
                want = {k: w for k, w in want.items() if not f.matches(old, {k: w})}
            if want == {}:
                continue
            phase = "loosen" if old is None else f.direction(old, want)
            action = Action("write", g.path, name, want, old, phase)
            (loosen if phase == "loosen" else tighten).append((g.depth, f.order, action))
    out.actions += [a for *_, a in sorted(loosen, key=lambda t: (t[0], t[1]))]
    out.actions += [a for *_, a in sorted(tighten, key=lambda t: (-t[0], -t[1]))]


def _prune(policy: CgroupPolicy, actual: Actual, options: Options, out: Plan) -> None:
    declared = {g.path for g in policy.groups}
    leaves = {f"{p}/{options.leaf}" if p else options.leaf for p in [SUBTREE, *declared]}
    extra = [p for p in actual.groups if p not in declared and p != SUBTREE and p not in leaves]
    out.undeclared = extra
    if not options.prune:
        return
    blocked: set[str] = set()
    for path in sorted(extra, key=lambda p: -p.count("/")):
        busy = (
            actual.groups[path].populated
            or any(c.startswith(path + "/") for c in blocked)
            or any(c.startswith(path + "/") for c in actual.groups if c not in extra)
        )
        if busy:
            blocked.add(path)
            out.warnings.append(f"{path}: not removed, it still holds processes or kept groups")
        else:
            out.actions.append(Action("delete", path))
