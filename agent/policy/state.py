"""What is free right now: the inventory's node model plus the allocations made on it.

`node_model.Node` describes a node as discovered (frozen); the scheduler needs the
same node minus what it has handed out. `NodeResources` keeps the handed-out part and answers
"free CPUs on this L3 domain", "free memory on GPU 3", "is TPU chip 2 held"; `Cluster` holds
the nodes, the placed tasks (for rack and node affinity) and a version that every change
bumps, so a decision can say which state it was computed on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..node_model import Node
from .policy import IO_CLASSES


@dataclass(frozen=True)
class GpuShare:
    index: int
    memory: int  # bytes reserved on that GPU
    whole: bool  # the task owns the GPU


@dataclass(frozen=True)
class Allocation:
    task: str
    node: str
    cpus: tuple[int, ...]
    memory: int
    gpus: tuple[GpuShare, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    tpus: tuple[int, ...] = ()  # TPU chip indices, each held whole


@dataclass
class L3State:
    numa: int
    id: int
    cpus: frozenset[int]
    cores: tuple[tuple[int, ...], ...]  # allocatable CPUs of each whole core (for smtExclusive)


@dataclass
class GpuState:
    index: int
    name: str
    cuda: tuple[int, int]
    numa: int | None
    island: int | None
    total: int
    base_free: int  # what the inventory saw free (driver, other users)
    reserved: int = 0
    holders: int = 0
    whole: bool = False
    # The largest free block of its memory where the node lays that out (the agent under
    # dwps: daemon/loop/gpumemory.py), so a share fits only in one block; None: not laid
    # out, any free bytes serve.
    largest_block: int | None = None

    @property
    def free(self) -> int:
        return 0 if self.whole else self.base_free - self.reserved


@dataclass
class TpuState:
    index: int
    model: str | None
    numa: int | None
    holders: int = 0  # 0 or 1: a chip is held whole


class NodeResources:
    """One node's resources as placement sees them: the model minus what is handed out."""

    def __init__(self, node: Node):
        self.node = node
        self.name = node.name
        self.labels = node.labels.as_dict()
        self.rack = node.labels.rack
        self.zone = node.labels.zone
        self.domains = [
            L3State(n.id, d.id, frozenset(d.cpus), tuple(c.cpus for c in d.cores if c.whole))
            for n in node.numa
            for d in n.l3
        ]
        self.numa_ids = tuple(n.id for n in node.numa)
        self.free_cpus: set[int] = set(node.allocatable_cpus)
        self.memory_free = node.memory.available
        self.gpus = [
            GpuState(
                g.index,
                g.name,
                tuple(g.cuda_driver_version),
                g.numa_node,
                g.island,
                g.memory_total,
                g.memory_free,
            )
            for g in node.gpus
        ]
        self.tpus = [TpuState(a.index, a.model, a.numa_node) for a in node.tpus]
        self.others = [a for a in node.accelerators if a.kind != "tpu"]
        self.io_rank = max((IO_CLASSES.index(d.io_class) for d in node.io), default=-1)
        self.io_classes = sorted({d.io_class for d in node.io}, key=IO_CLASSES.index)
        self.tasks: dict[str, Allocation] = {}

    def gpu(self, index: int) -> GpuState:
        return next(g for g in self.gpus if g.index == index)

    def tpu(self, index: int) -> TpuState:
        return next(t for t in self.tpus if t.index == index)

    def apply(self, a: Allocation) -> None:
        taken = set(a.cpus) - self.free_cpus
        if taken or a.memory > self.memory_free:
            raise ValueError(f"{a.task}: allocation on {self.name} overlaps (cpus {sorted(taken)})")
        held = [i for i in a.tpus if self.tpu(i).holders]
        if held:
            raise ValueError(f"{a.task}: TPU chips {held} on {self.name} are already held")
        self.free_cpus -= set(a.cpus)
        self.memory_free -= a.memory
        for share in a.gpus:
            g = self.gpu(share.index)
            g.reserved += share.memory
            g.holders += 1
            g.whole = g.whole or share.whole
        for i in a.tpus:
            self.tpu(i).holders += 1
        self.tasks[a.task] = a

    def release(self, task: str) -> Allocation:
        a = self.tasks.pop(task)
        self.free_cpus |= set(a.cpus)
        self.memory_free += a.memory
        for share in a.gpus:
            g = self.gpu(share.index)
            g.reserved -= share.memory
            g.holders -= 1
            g.whole = g.whole and not share.whole
        for i in a.tpus:
            self.tpu(i).holders -= 1
        return a


@dataclass
class Cluster:
    nodes: dict[str, NodeResources] = field(default_factory=dict)
    version: int = 0
    where: dict[str, str] = field(default_factory=dict)  # task -> node

    @classmethod
    def of(cls, nodes: Iterable[Node], allocations: Iterable[Allocation] = ()) -> Cluster:
        c = cls({n.name: NodeResources(n) for n in nodes})
        for a in allocations:
            c.commit(a)
        return c

    def commit(self, a: Allocation) -> None:
        if a.task in self.where:
            raise ValueError(f"{a.task} is already placed on {self.where[a.task]}")
        self.nodes[a.node].apply(a)
        self.where[a.task] = a.node
        self.version += 1

    def release(self, task: str) -> Allocation:
        a = self.nodes[self.where.pop(task)].release(task)
        self.version += 1
        return a

    def touch(self) -> None:
        """Something placement reads changed without a commit or a release (a GPU's
        `largest_block`): decisions made on the state before are stale."""
        self.version += 1

    def placed(self) -> Iterable[tuple[NodeResources, Allocation]]:
        for st in self.nodes.values():
            for a in st.tasks.values():
                yield st, a
