"""Plan and apply a CgroupPolicy: the use-case `xhagent cgroup apply` and the daemon share.

Order matters and is the point of this module:

1. take the subtree's lock (nothing else changes the tree until we are done);
2. plan against the tree as it will be once the agent has moved into its leaf;
3. a plan with errors stops here: nothing was written, no process moved;
4. settle delegation (the agent's own processes into its leaf), then apply the plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .delegation import pending, settle
from .lock import SubtreeLock
from .mounts import Hierarchy
from .policy import CgroupPolicy
from .reconcile import Options, Plan, plan
from .state import ApplyReport, apply, read_actual, undo
from .subtree import Subtree


@dataclass
class Outcome:
    plan: Plan
    report: ApplyReport = field(default_factory=ApplyReport)
    applied: bool = False  # False: the plan had errors, and nothing was touched
    settled: list[int] = field(default_factory=list)  # pids moved into the agent's leaf


def plan_policy(
    policy: CgroupPolicy, sub: Subtree, options: Options, hierarchy: Hierarchy | None = None
) -> Plan:
    """What applying would do; reads the tree, writes nothing. The agent's processes still in
    a delegated unit cgroup are planned as already moved to its leaf (apply moves them first)."""
    actual = read_actual(sub, policy, hierarchy)
    root = actual.groups.get("")
    if root and sub.agent_leaf:
        moving = set(pending(sub.mount, sub.placement))
        root.procs = [p for p in root.procs if p not in moving]
    return plan(policy, actual, options)


def apply_policy(
    policy: CgroupPolicy,
    sub: Subtree,
    options: Options,
    hierarchy: Hierarchy | None = None,
    *,
    wait: bool = True,
    on_wait: Callable[[int | None], None] | None = None,
    outcome: Outcome | None = None,
    rollback: bool = False,
) -> Outcome:
    """Plan and, when the plan has no errors, settle and apply it under the subtree's lock.

    Stops at the first refusal (`outcome.report.failed`); with `rollback`, what was applied
    before it is then taken back, still under the lock (`report.undone`, `not_undone`). A
    caller that passes `outcome` still has what was applied when a stop signal (Terminated)
    ends the run between two actions.
    Raises CgroupError (LockBusy with `wait=False`) when the tree cannot be read or locked."""
    with SubtreeLock(sub.path).acquire(wait=wait, on_wait=on_wait):
        p = plan_policy(policy, sub, options, hierarchy)
        if outcome is None:
            outcome = Outcome(p)
        outcome.plan = p
        if p.errors:
            outcome.report.not_applied = list(p.actions)
            return outcome
        if sub.agent_leaf:
            outcome.settled = settle(sub.mount, sub.placement)
        apply(p, sub, outcome.report)
        if rollback and outcome.report.failed:
            undo(outcome.report, sub)
        outcome.applied = True
        return outcome
