"""A CgroupPolicy put into the kernel for the policy set: planned against the agent's subtree
and the node's real cgroup mode, applied whole or not at all (a refusal half-way takes back
what was applied before it), and said in one record: what changed, or each setting that
could not be made and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...cgroups.enact import apply_policy
from ...cgroups.mounts import discover_hierarchy
from ...cgroups.policy import CgroupPolicy
from ...cgroups.reconcile import Options
from ...cgroups.subtree import Subtree


@dataclass(frozen=True)
class Enacted:
    policy: str
    mode: str  # the node's cgroup mode: unified, hybrid, legacy, none
    changes: tuple[str, ...] = ()  # each change made, described
    not_applied: tuple[str, ...] = ()  # each setting not made, and why; empty: it is in force
    not_undone: tuple[str, ...] = ()  # after a refusal, what could not be taken back

    @property
    def ok(self) -> bool:
        return not self.not_applied

    def report(self) -> str:
        """What a caller is answered: a line, then each setting not made on one of its own."""
        if self.ok:
            return self.summary()
        lines = [f"CgroupPolicy {self.policy} was not applied (cgroup mode {self.mode}):"]
        lines += [f"  {line}" for line in self.not_applied]
        lines += [f"  not taken back: {line}" for line in self.not_undone]
        return "\n".join(lines)

    def summary(self) -> str:
        """One line for an event or a log."""
        if self.ok:
            return f"CgroupPolicy {self.policy}: {len(self.changes)} changes"
        line = f"CgroupPolicy {self.policy} not applied (cgroup mode {self.mode}): " + "; ".join(
            self.not_applied
        )
        if self.not_undone:
            line += "; not taken back: " + "; ".join(self.not_undone)
        return line


def enact(policy: CgroupPolicy, sub: Subtree) -> Enacted:
    """Plan and apply `policy` in `sub`, with rollback on a refusal."""
    hierarchy = discover_hierarchy()
    try:
        out = apply_policy(policy, sub, Options(), hierarchy, rollback=True)
    except (OSError, ValueError) as exc:  # the tree could not be read or locked
        return Enacted(policy.name, hierarchy.mode, not_applied=(str(exc),))
    if not out.applied:
        return Enacted(policy.name, hierarchy.mode, not_applied=tuple(out.plan.errors))
    report = out.report
    if report.failed:
        action, why = report.failed
        return Enacted(
            policy.name,
            hierarchy.mode,
            not_applied=(f"{action.describe()}: {why}",),
            not_undone=tuple(f"{a.describe()}: {w}" for a, w in report.not_undone),
        )
    return Enacted(policy.name, hierarchy.mode, changes=tuple(a.describe() for a in report.applied))
