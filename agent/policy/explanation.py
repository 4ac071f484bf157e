"""Explain a placement: which policy won, what the task needs, where it goes, and every
node's verdict, placed or not.

`explain()` is the entry point `xhagent policy explain` renders and the daemon's API
serves. It evaluates each node once, through the same `evaluate_nodes` and `decision_of`
that `decide()` uses, so the verdicts it shows are the ones the placement was chosen from.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..quantity import human
from .placement import Candidate, Demand, PlacementDecision, Reason, decision_of, evaluate_nodes
from .policy import Match, SchedulingPolicy, choose
from .state import Cluster
from .task import Task


@dataclass(frozen=True)
class Explanation:
    task: Task
    match: Match  # the winning policy and rule (None: defaults)
    demand: Demand
    decision: PlacementDecision  # placed, or Pending with a reason per node
    verdicts: dict[str, Candidate | Reason]  # every node, in the cluster's order

    @property
    def pending(self) -> bool:
        return self.decision.pending

    def as_dict(self) -> dict:
        """The JSON record of `policy explain --json` (one element of its `tasks`)."""
        pol = self.match.policy
        placed = self.decision.placed
        return {
            "task": self.task.name,
            "device_type": self.task.device_type,
            "policy": pol.name if pol else None,
            "policy_priority": pol.priority if pol else None,
            "preemption": pol.preemption if pol else None,
            "tied_with": list(self.match.tied_with),
            "demand": describe(self.demand),
            "pending": placed is None,
            "placed": _candidate(placed) if placed else None,
            "nodes": {name: _verdict(v) for name, v in self.verdicts.items()},
        }


def explain(task: Task, policies: Iterable[SchedulingPolicy], cluster: Cluster) -> Explanation:
    """Where `task` would be placed on `cluster` under `policies`, and every node's verdict."""
    match = choose(policies, task.label_map)
    demand = Demand.of(task, match)
    verdicts = evaluate_nodes(demand, cluster)
    decision = decision_of(task.name, verdicts, cluster.version)
    return Explanation(task, match, demand, decision, verdicts)


def _verdict(v: Candidate | Reason) -> dict:
    if isinstance(v, Reason):
        return {"feasible": False, "kind": v.kind, "reason": str(v)}
    return {"feasible": True, "score": v.score}


def _candidate(c: Candidate) -> dict:
    return {
        "node": c.node,
        "cpus": list(c.cpus),
        "memory": c.memory,
        "gpus": [{"index": g.index, "memory": g.memory, "whole": g.whole} for g in c.gpus],
        "tpus": list(c.tpus),
        "score": c.score,
        "parts": dict(c.parts),
    }


def describe(d: Demand) -> str:
    """What a demand asks for, in words ("4 CPUs, 8 GiB memory, 1 GPU with 16 GiB free")."""
    parts = [
        f"{d.cpus} CPU{'' if d.cpus == 1 else 's'}"
        + (" on whole cores" if d.smt_exclusive else "")
        + (" on one NUMA node" if d.numa_single else "")
    ]
    if d.memory:
        parts.append(f"{human(d.memory)} memory")
    if d.gpus:
        each = f" with {human(d.gpu_memory)} free" if d.gpu_memory is not None else " (whole)"
        parts.append(f"{d.gpus} GPU{'s' if d.gpus > 1 else ''}{each}")
    if d.tpu_chips:
        parts.append(f"{d.tpu_chips} TPU chip{'s' if d.tpu_chips > 1 else ''}")
    if d.min_cuda:
        parts.append(f"CUDA >= {d.min_cuda[0]}.{d.min_cuda[1]}")
    if d.gpu_model:
        parts.append(f"GPU model {d.gpu_model}")
    if d.numa_affinity != "none":
        parts.append(f"NUMA affinity {d.numa_affinity}")
    if d.io_class:
        parts.append(f"IO class {d.io_class}")
    if d.zone:
        parts.append(f"zone {d.zone}")
    if d.rack_affinity:
        parts.append(f"rack {d.rack_affinity} as {d.rack_peers}")
    if d.same_node_as:
        parts.append(f"on a node running {d.same_node_as}")
    if d.away_from:
        parts.append(f"away from {d.away_from}")
    if d.device_type == "tpu":
        parts.append("a TPU")
    return ", ".join(parts)
