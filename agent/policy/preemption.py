"""Which running tasks a waiting one may take the place of (seed 000 4.1): the victims.

Pure: it reads a Cluster and the candidates' standing, and answers with the smallest set
of victims, taken cheapest first, after which the demand fits; or None. A victim is
strictly lower in priority than the preemptor (`lower-priority`, the default), or, under
`deadline-driven`, not higher in priority and due later, or, under `queueing`, ranked
strictly after it by the node's order (`rank`: its discipline's key, the simulator's rule
for displacing a running job; a discipline that never preempts, fifo, gives no ranks, so
no victims). Victims are taken cheapest first: lowest priority, then latest deadline, then
the most recently started; under `queueing`, the worst ranked first. A task that says
`preemption: never` is never a victim; one that is frozen (`freeze`) keeps its memory and
GPUs, so only its CPUs are freed; one that is killed (`kill`) frees everything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from .placement import Candidate, Demand, decide_demand
from .state import Allocation, Cluster

NO_DEADLINE = 1 << 63


@dataclass(frozen=True)
class Standing:
    """A running task as a possible victim."""

    allocation: Allocation
    priority: int
    deadline_ns: int = NO_DEADLINE
    mode: str = "freeze"  # freeze | kill | never
    started_ns: int = 0
    rank: tuple | None = None  # the node order's key (`queueing`); None: not ranked


@dataclass(frozen=True)
class Preemption:
    victims: tuple[Standing, ...]
    placed: Candidate  # where the preemptor goes once they are out of the way


def may_preempt(
    rule: str, priority: int, deadline_ns: int, victim: Standing, rank: tuple | None = None
) -> bool:
    if victim.mode == "never" or rule == "never":
        return False
    if rule == "queueing":
        return rank is not None and victim.rank is not None and victim.rank > rank
    if rule == "deadline-driven":
        return victim.priority <= priority and victim.deadline_ns > deadline_ns
    return victim.priority < priority


def choose_victims(
    name: str,
    demand: Demand,
    cluster: Cluster,
    running: Iterable[Standing],
    *,
    rule: str,
    priority: int,
    deadline_ns: int = NO_DEADLINE,
    rank: tuple | None = None,
) -> Preemption | None:
    """The fewest victims, cheapest first (lowest priority, then latest deadline, then the
    most recently started: the least work lost; under `queueing` the worst ranked first),
    that make `demand` fit; None when even all of them would not."""
    eligible = [v for v in running if may_preempt(rule, priority, deadline_ns, v, rank)]
    if rule == "queueing":
        eligible.sort(key=lambda v: v.rank, reverse=True)
    else:
        eligible.sort(key=lambda v: (v.priority, -v.deadline_ns, -v.started_ns))
    taken: list[Standing] = []
    for victim in eligible:
        taken.append(victim)
        decision = decide_demand(name, demand, _without(cluster, taken))
        if not decision.pending:
            return Preemption(_needed(name, demand, cluster, taken), decision.placed)
    return None


def _without(cluster: Cluster, victims: list[Standing]) -> Cluster:
    """The cluster as it would be with the victims frozen (CPUs freed) or killed (all)."""
    gone = {v.allocation.task: v for v in victims}
    nodes = [st.node for st in cluster.nodes.values()]
    kept = []
    for _, a in cluster.placed():
        v = gone.get(a.task)
        if v is None:
            kept.append(a)
        elif v.mode == "freeze":
            kept.append(replace(a, cpus=()))
    return Cluster.of(nodes, kept)


def _needed(name: str, demand: Demand, cluster: Cluster, taken: list[Standing]):
    """Drop victims the fit does not need (a later, bigger one may make an earlier one
    unnecessary), keeping the order."""
    needed = list(taken)
    for v in list(taken[:-1]):
        trial = [t for t in needed if t is not v]
        if not decide_demand(name, demand, _without(cluster, trial)).pending:
            needed = trial
    return tuple(needed)
