"""Load-driven migration between accelerators (seed 003, chapter 1): the decision, nothing else.

The seed's rule: every 5 s the scheduler samples each device's load; when a GPU is above
0.85 and an idle TPU exists, a task marked migratable moves there, provided its data can
follow, the TPU runtime supports its operators and its memory fits. Here:

- a device is *hot* above `hot_above` and *idle* below `idle_below` (the seed's idle bound
  was lost from its text; 0.3 is ours), with room for one more task now; the gap between
  the two is the hysteresis. A task moved in the previous round stays where it is, and a
  task never goes back to a device it left (`left`, kept by the caller): a lone task that
  makes whichever device holds it hot would otherwise bounce between two. Such a lone
  task moves only to another device type (which frees its device for the work only that
  type can run): to a device of its own type it would carry the heat along;
- "supports its operators" is the task's `runs_on` set of device types; GPU to GPU on
  another node (or the same) is a move as well;
- every other hard constraint (CUDA version, GPU model and memory, zone, rack, affinity,
  NUMA) is the placement core's: `placement.evaluate` on the destination node, narrowed
  to the destination device, with the task's own allocation released. There is no second
  check here, so a move can never place what placement would refuse;
- each hot device sheds at most one task per round and each idle device takes at most
  one, and a task moves at most once: the next round measures the effect first;
- among the admissible moves the cheapest by fair share's distance-weighted migration
  penalty wins (fair.py: same NUMA node, another, another machine), then the least loaded
  destination. The caller charges the penalty when it enacts the move.

Only tasks on one accelerator move (CPU work is the kernel's to balance; a task on two GPUs
stays). Data residency is not modelled. A TPU task moved to a GPU takes the GPU whole, since
its GPU memory is unknown.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from ..policy.placement import Candidate, Demand, Peers, Reason, evaluate
from ..policy.policy import Match, Migration
from ..policy.state import Cluster
from ..policy.task import Task
from .fair import FairShare

ACCELERATORS = ("gpu", "tpu")


@dataclass(frozen=True)
class Device:
    node: str
    kind: str  # gpu | tpu
    index: int
    load: float  # 0..1, sampled over the last interval
    numa: int = 0
    room: bool = True  # can take one more task now

    @property
    def id(self) -> str:
        return f"{self.node}/{self.kind}{self.index}"

    @property
    def place(self) -> tuple[str, int]:
        return (self.node, self.numa)


@dataclass(frozen=True)
class Running:
    task: Task  # as it runs now (device_type: the kind of `device`)
    match: Match  # its winning policy rule: the hard constraints
    device: str  # Device.id it holds
    runs_on: frozenset[str] = frozenset()  # device types it may run on; empty: its own

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def kinds(self) -> frozenset[str]:
        return self.runs_on or frozenset({self.task.device_type})


@dataclass(frozen=True)
class Move:
    task: str
    src: str
    dst: str
    reason: str
    penalty_ns: float  # fair share's migration penalty, to charge on enactment


def as_kind(task: Task, kind: str) -> Task:
    """The task as it would run on one device of `kind`: what placement is asked about."""
    gpu = kind == "gpu"
    requests = replace(
        task.requests,
        gpus=1 if gpu else None,
        gpu_memory=task.requests.gpu_memory if gpu and task.device_type == "gpu" else None,
    )
    return replace(task, device_type=kind, requests=requests)


def admits(cluster: Cluster, r: Running, dst: Device) -> Reason | None:
    """None when placement would put `r` on `dst` (in `cluster`, where `r` no longer runs);
    else placement's reason."""
    out = placement_on(cluster, r, dst)
    return out if isinstance(out, Reason) else None


def placement_on(cluster: Cluster, r: Running, dst: Device) -> Candidate | Reason:
    """Where placement would put `r` on `dst` (in `cluster`, where `r` no longer runs): the
    candidate whose device share the daemon enacts, or placement's reason."""
    demand = Demand.of(as_kind(r.task, dst.kind), r.match)
    if demand.gpus > 1:
        return Reason("NotMovable", dst.node, f"{r.name} needs {demand.gpus} GPUs")
    st = cluster.nodes.get(dst.node)
    if st is None:
        return Reason("UnknownNode", dst.node, f"{dst.node} is not in the cluster")
    view = copy.copy(st)
    view.gpus = [g for g in st.gpus if dst.kind == "gpu" and g.index == dst.index]
    view.tpus = [t for t in st.tpus if dst.kind == "tpu" and t.index == dst.index]
    if not (view.gpus or view.tpus):
        return Reason("UnknownDevice", dst.node, f"{dst.node} has no {dst.id}")
    return evaluate(demand, view, Peers(cluster) if demand.needs_peers else None)


def without(cluster: Cluster, task: str) -> Cluster:
    """`cluster` as if `task` had stopped; only its node is copied, nothing is changed."""
    node = cluster.where.get(task)
    if node is None:
        return cluster
    st = cluster.nodes[node]
    mine = copy.copy(st)
    mine.free_cpus = set(st.free_cpus)
    mine.gpus = [replace(g) for g in st.gpus]
    mine.tpus = [replace(t) for t in st.tpus]
    mine.tasks = dict(st.tasks)
    out = Cluster({**cluster.nodes, node: mine}, cluster.version, dict(cluster.where))
    out.release(task)
    return out


def decide(
    devices: Iterable[Device],
    running: Iterable[Running],
    cluster: Cluster,
    policy: Migration,
    fair: FairShare,
    elapsed_ns: int,
    recently_moved: frozenset[str] = frozenset(),
    left: Mapping[str, Collection[str]] | None = None,
) -> list[Move]:
    """The moves of one round; none until `policy.interval_ns` has elapsed since the last.
    `recently_moved`: tasks moved in the last round; `left`: task -> devices it moved off."""
    left = left or {}
    if elapsed_ns < policy.interval_ns:
        return []
    devices = [d for d in devices if d.kind in ACCELERATORS]
    by_id = {d.id: d for d in devices}
    hot = sorted((d for d in devices if d.load > policy.hot_above), key=lambda d: (-d.load, d.id))
    idle = [d for d in devices if d.load < policy.idle_below and d.room]
    on: dict[str, list[Running]] = {}
    holders: dict[str, int] = {}
    for r in running:
        holders[r.device] = holders.get(r.device, 0) + 1
        if r.task.migratable and r.name not in recently_moved and r.device in by_id:
            on.setdefault(r.device, []).append(r)
    taken: set[str] = set()
    moves = []
    for src in hot:
        best = None
        for r in sorted(on.get(src.id, ()), key=lambda r: r.name):
            view = without(cluster, r.name)
            for dst in idle:
                if dst.id in taken or dst.id == src.id or dst.kind not in r.kinds:
                    continue
                if dst.id in left.get(r.name, ()):
                    continue
                if dst.kind == src.kind and holders[src.id] == 1:
                    continue
                if admits(view, r, dst) is not None:
                    continue
                penalty = fair.penalty(src.place, dst.place)
                key = (penalty, dst.load, r.task.priority or 0, r.name, dst.id)
                if best is None or key < best[0]:
                    best = (key, r, dst, penalty)
        if best is None:
            continue
        _, r, dst, penalty = best
        taken.add(dst.id)
        moves.append(
            Move(
                r.name,
                src.id,
                dst.id,
                f"{src.id} load {src.load:.2f} > {policy.hot_above:g}, "
                f"{dst.id} load {dst.load:.2f} < {policy.idle_below:g}",
                penalty,
            )
        )
    return moves
