"""Reading the actual tree for the planner, and applying a plan to the kernel.

Readers do not lock: a group created or removed by someone else while the tree is read is
left out or taken as it is found, not an error (`vanished`).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..signals import signals_held
from . import io_weight, registry
from .group import Cgroup, CgroupError
from .mounts import Hierarchy
from .policy import CgroupPolicy
from .reconcile import ROOT, Action, Actual, ActualGroup, Limit, Plan
from .subtree import Subtree, systemd_manages_root


def vanished(exc: OSError) -> bool:
    """A group removed under the reader: its directory is gone (ENOENT), or a file opened
    just before the rmdir reads ENODEV."""
    return exc.errno in (errno.ENOENT, errno.ENODEV)


def read_group(cg: Cgroup, files: list[registry.CgroupFile]) -> ActualGroup:
    values = {}
    for f in files:
        if cg.has(f):
            values[f.name] = cg.get(f)
    return ActualGroup(
        cg.controllers(),
        cg.subtree_control(),
        cg.procs(),
        bool(cg.events().get("populated")),
        values,
    )


def _limit(cg: Cgroup, f: registry.CgroupFile) -> int | None:
    try:
        value = cg.read(f.name).strip()
    except CgroupError:
        return None  # an older kernel without the file: no limit to check
    return None if value == "max" else int(value)


def read_limits(sub: Subtree) -> list[Limit]:
    """The depth and descendant limits of the subtree and every group above it."""
    out, path, k = [], sub.path, 0
    while True:
        if path.is_dir():
            cg = Cgroup(path)
            stat = cg.get(registry.CGROUP_STAT) if cg.has(registry.CGROUP_STAT) else {}
            out.append(
                Limit(
                    k,
                    str(path),
                    _limit(cg, registry.MAX_DEPTH),
                    _limit(cg, registry.MAX_DESCENDANTS),
                    int(stat.get("nr_descendants", 0)),
                )
            )
        if path == sub.top.path or path == path.parent:
            return out
        path, k = path.parent, k + 1


def read_actual(
    sub: Subtree,
    policy: CgroupPolicy,
    hierarchy: Hierarchy | None = None,
    sys_root: Path = Path("/sys"),
) -> Actual:
    top = sub.top
    support = registry.Support(top.path)
    files = [f for f in registry.SETTINGS + (registry.IO_BFQ_WEIGHT,) if support.supported(f)]
    groups = {}
    if sub.path.is_dir():
        groups[""] = read_group(sub.root, [])
        for rel in sub.walk():
            try:
                groups[rel] = read_group(sub.group(rel), files)
            except CgroupError as exc:
                if not vanished(exc):
                    raise
    parent = Cgroup(sub.path.parent)
    # Every disk's scheduler, not only those the policy names: a BFQ disk needs the groups'
    # default weight in io.bfq.weight even when no per-device weight mentions it.
    disks = {
        (p / "dev").read_text().strip()
        for p in (sys_root / "block").glob("*")
        if (p / "queue/scheduler").exists()
    }
    devices = {d for g in policy.groups for d in g.devices} | disks
    qos = top.read(registry.IO_COST_QOS.name) if top.has(registry.IO_COST_QOS) else ""
    root_values = {f.name: top.get(f) for f in registry.ROOT_IO_COST if top.has(f)}
    return Actual(
        root_controllers=top.controllers(),
        parent_subtree_control=parent.subtree_control(),
        groups=groups,
        subtree_is_top_level=sub.path.parent == top.path,
        systemd_root=systemd_manages_root(top.path),
        io_cost_enabled=io_weight.io_cost_enabled(qos),
        root_values=root_values,
        schedulers={d: io_weight.scheduler(d, sys_root) for d in devices},
        unsupported={
            f.name for f in registry.BY_NAME.values() if f.controller and not support.supported(f)
        },
        mode=hierarchy.mode if hierarchy else "unified",
        v1_controllers=hierarchy.v1_controllers if hierarchy else (),
        subtree_path=str(sub.path),
        agent_leaf=sub.agent_leaf,
        limits=read_limits(sub),
    )


@dataclass
class ApplyReport:
    applied: list[Action] = field(default_factory=list)
    failed: tuple[Action, str] | None = None
    not_applied: list[Action] = field(default_factory=list)
    moved: dict[str, list[int]] = field(default_factory=dict)  # group -> pids moved into its leaf
    # after a refusal, with undo(): the applied actions taken back, and those that could not be
    undone: list[Action] = field(default_factory=list)
    not_undone: list[tuple[Action, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "applied": [a.as_dict() for a in self.applied],
            "failed": {"action": self.failed[0].as_dict(), "error": self.failed[1]}
            if self.failed
            else None,
            "not_applied": [a.as_dict() for a in self.not_applied],
        }


def apply(plan: Plan, sub: Subtree, report: ApplyReport | None = None) -> ApplyReport:
    """Run the plan's actions in order; stop at the first refusal. Every write is read
    back: a value the kernel accepted but did not keep counts as a refusal. Each action runs
    with the stop signals held, so a stop lands between two actions; a caller that passes
    `report` still has what was applied when a stop ends the run."""
    report = report if report is not None else ApplyReport()
    if plan.errors:
        report.not_applied = list(plan.actions)
        return report
    report.not_applied = list(plan.actions)
    for i, action in enumerate(plan.actions):
        try:
            with signals_held():  # a stop is delivered once the action and its record are done
                _run(action, sub, report)
                report.applied.append(action)
                report.not_applied = plan.actions[i + 1 :]
        except (CgroupError, ValueError) as exc:
            report.failed = (action, str(exc))
            report.not_applied = plan.actions[i + 1 :]
            return report
    return report


def undo(report: ApplyReport, sub: Subtree) -> ApplyReport:
    """Take back what `report` applied, last first, so that a refused plan leaves the tree as
    it was: a value written gets its old one again, a controller enabled is disabled, the
    processes moved into a leaf go back, a group created is removed. The root's io.cost
    settings and a group deleted cannot be taken back: they are listed as not undone, as is
    any step the kernel refuses (the steps after it are still tried)."""
    for action in reversed(report.applied):
        try:
            with signals_held():
                _take_back(action, sub, report)
            report.undone.append(action)
        except (CgroupError, ValueError) as exc:
            report.not_undone.append((action, str(exc)))
    report.applied = [a for a in report.applied if a not in report.undone]
    return report


def _take_back(action: Action, sub: Subtree, report: ApplyReport) -> None:
    if action.group == ROOT or action.kind == "delete":
        raise ValueError(f"{action.describe()} cannot be taken back")
    cg = sub.group(action.group)
    if action.kind == "create":
        cg.remove()
    elif action.kind == "write":
        if action.old is not None:  # unset before: the group was made by this apply
            cg.set(registry.BY_NAME[action.file], action.old)
    elif action.kind == "enable":
        cg.write(registry.SUBTREE_CONTROL.name, " ".join(f"-{c}" for c in action.value))
    elif action.kind == "move-procs":
        for pid in report.moved.get(action.group, ()):
            try:
                cg.add_proc(pid)
            except CgroupError as exc:
                if exc.errno != errno.ESRCH:  # exited meanwhile
                    raise
    else:
        raise ValueError(f"unknown action {action.kind}")


def _run(action: Action, sub: Subtree, report: ApplyReport) -> None:
    if action.group == ROOT:
        if action.kind == "enable":
            sub.top.write(registry.SUBTREE_CONTROL.name, " ".join(f"+{c}" for c in action.value))
        elif action.kind == "io-cost":
            sub.top.write(registry.IO_COST_QOS.name, f"{action.value} enable=1")
            if action.value not in io_weight.io_cost_enabled(
                sub.top.read(registry.IO_COST_QOS.name)
            ):
                raise CgroupError(
                    0,
                    f"{sub.top.path / registry.IO_COST_QOS.name}: "
                    f"{action.value} enable=1 did not read back",
                )
        elif action.kind == "write" and action.file in {f.name for f in registry.ROOT_IO_COST}:
            _write_back(sub.top, registry.BY_NAME[action.file], action.value)
        else:
            raise ValueError(f"{action.kind} is not allowed at the cgroup2 root")
        return
    cg = sub.group(action.group)
    if action.kind == "create":
        cg.create()
    elif action.kind == "delete":
        cg.remove()
    elif action.kind == "move-procs":
        report.moved[action.group] = cg.move_procs_to(sub.group(action.value))
    elif action.kind == "enable":
        cg.write(registry.SUBTREE_CONTROL.name, " ".join(f"+{c}" for c in action.value))
    elif action.kind == "write":
        _write_back(cg, registry.BY_NAME[action.file], action.value)
    else:
        raise ValueError(f"unknown action {action.kind}")


def _write_back(cg: Cgroup, f: registry.CgroupFile, value: Any) -> None:
    """Write a declared file and read it back: a value the kernel accepted but did not keep
    is a refusal."""
    cg.set(f, value)
    back = cg.get(f)
    if not f.matches(back, value):
        raise CgroupError(
            0, f"{cg.path / f.name}: the kernel accepted {value} but reads back {back}"
        )
