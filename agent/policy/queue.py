"""Pending tasks, kept in order, re-evaluated all at once when the policy set changes.

Order: effective priority (the task's own, else its winning policy's, else 50), then the
earlier absolute deadline, then arrival. A re-evaluation matches policies once per label
set and decides once per distinct `Demand` (what a task needs after its policy), so 10k
pending tasks of a few hundred demands cost a few hundred decisions, not 10k.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from .placement import Demand, PlacementDecision, decide_demand
from .policy import DEFAULT_PRIORITY, Match, SchedulingPolicy, choose
from .state import Allocation, Cluster
from .task import Task

NO_DEADLINE = 1 << 63


@dataclass
class Pending:
    task: Task
    submitted_ns: int
    seq: int
    match: Match = Match(None, None)
    demand: Demand | None = None
    decision: PlacementDecision | None = None

    @property
    def priority(self) -> int:
        if self.task.priority is not None:
            return self.task.priority
        return self.match.policy.priority if self.match.policy else DEFAULT_PRIORITY

    @property
    def deadline_ns(self) -> int:
        return self.task.deadline.at(self.submitted_ns) if self.task.deadline else NO_DEADLINE

    def key(self) -> tuple:
        return (-self.priority, self.deadline_ns, self.seq)


@dataclass
class PendingQueue:
    cluster: Cluster
    policies: dict[str, SchedulingPolicy] = field(default_factory=dict)
    pending: dict[str, Pending] = field(default_factory=dict)
    _heap: list = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)

    # -- tasks
    def submit(self, task: Task, now_ns: int = 0) -> Pending:
        if task.name in self.pending or task.name in self.cluster.where:
            raise ValueError(f"task {task.name!r} is already known")
        p = Pending(task, now_ns, next(self._seq))
        p.match = choose(self.policies.values(), task.label_map)
        p.demand = Demand.of(task, p.match)
        self.pending[task.name] = p
        heapq.heappush(self._heap, (p.key(), task.name))
        return p

    def pop(self) -> Pending | None:
        """The first pending task in order, taken off the queue (its entry stays in `pending`
        until `remove`); `requeue` puts it back behind tasks of the same key."""
        while self._heap:
            key, name = heapq.heappop(self._heap)
            p = self.pending.get(name)
            if p is not None and p.key() == key:
                return p
        return None

    def requeue(self, p: Pending) -> None:
        p.seq = next(self._seq)
        heapq.heappush(self._heap, (p.key(), p.task.name))

    def remove(self, name: str) -> Pending:
        return self.pending.pop(name)  # its heap entry is skipped lazily

    def ordered(self) -> list[Pending]:
        return sorted(self.pending.values(), key=Pending.key)

    # -- policies
    def apply_policy(self, policy: SchedulingPolicy) -> dict[str, PlacementDecision]:
        self.policies[policy.name] = policy
        return self.reevaluate()

    def remove_policy(self, name: str) -> dict[str, PlacementDecision]:
        self.policies.pop(name)
        return self.reevaluate()

    def reevaluate(self) -> dict[str, PlacementDecision]:
        """Every pending task against the current policies and node state, at once."""
        policies = list(self.policies.values())
        matches: dict[tuple, Match] = {}
        demands: dict[tuple, Demand] = {}
        decided: dict[Demand, PlacementDecision] = {}
        out = {}
        for name, p in self.pending.items():
            task = p.task
            match = matches.get(task.labels)
            if match is None:
                match = matches[task.labels] = choose(policies, task.label_map)
            key = (id(match.rule), task.device_type, task.requests)
            demand = demands.get(key)
            if demand is None:
                demand = demands[key] = Demand.of(task, match)
            decision = decided.get(demand)
            if decision is None:
                decision = decided[demand] = decide_demand(name, demand, self.cluster)
            p.match, p.demand = match, demand
            p.decision = out[name] = PlacementDecision(
                name, decision.placed, decision.reasons, decision.version
            )
        self._heap = [(p.key(), name) for name, p in self.pending.items()]
        heapq.heapify(self._heap)
        return out

    # -- placing
    def schedule(self) -> list[Allocation]:
        """Place pending tasks in order while they fit; the rest keep their reasons.
        A demand that did not fit stays unfit for the rest of the pass (placing only
        takes resources away), unless it depends on where other tasks run."""
        placed = []
        unfit: dict[Demand, PlacementDecision] = {}
        for p in self.ordered():
            d = p.demand
            known = unfit.get(d)
            decision = known if known is not None else decide_demand(p.task.name, d, self.cluster)
            if decision.placed is None:
                p.decision = PlacementDecision(
                    p.task.name, None, decision.reasons, decision.version
                )
                if not d.needs_peers:
                    unfit[d] = decision
                continue
            alloc = decision.placed.allocation(p.task)
            self.cluster.commit(alloc)
            self.remove(p.task.name)
            placed.append(alloc)
        return placed

    def extend(self, tasks: Iterable[Task], now_ns: int = 0) -> None:
        for t in tasks:
            self.submit(t, now_ns)
