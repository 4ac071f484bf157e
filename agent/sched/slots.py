"""The simulator's devices: nodes as counts (`NodeSpec`), one `Slot` per CPU, TPU chip and
share of a GPU, and the free slots indexed so that finding one is a heap operation.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpus: int = 1
    gpus: int = 0
    tpus: int = 0
    numa_nodes: int = 1
    cpu_numa: tuple[int, ...] = ()  # NUMA node of each CPU / GPU when known (inventory)
    gpu_numa: tuple[int, ...] = ()
    tpu_numa: tuple[int, ...] = ()
    gpu_memory: int = 0  # bytes per GPU; 0: GPU memory is not modelled
    gpu_shares: int = 1  # jobs one GPU runs at once (a slot each)
    # The inventory's node (node_model.Node) this was made from, for the placement core's
    # hard constraints (migration); None: nodes.as_model makes one from the counts.
    model: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Slot:
    id: str
    node: str
    device: str
    numa: int
    gpu: str = ""  # the GPU whose memory this slot's job uses; "" when not modelled
    index: int = 0  # which of its node's CPUs, GPUs or TPUs
    unit: str = ""  # that device ("node/gpu0"), shared by the slots of one GPU's shares

    @property
    def place(self) -> tuple[str, int]:
        return (self.node, self.numa)


def slots_of(nodes: list[NodeSpec]) -> list[Slot]:
    """One slot per CPU and TPU and per share of a GPU, on its NUMA node where known;
    otherwise a node's devices are spread over its NUMA nodes in contiguous runs."""
    slots = []
    for node in nodes:
        for device, count, known, shares in (
            ("cpu", node.cpus, node.cpu_numa, 1),
            ("gpu", node.gpus, node.gpu_numa, node.gpu_shares),
            ("tpu", node.tpus, node.tpu_numa, 1),
        ):
            per_numa = max(1, -(-count // node.numa_nodes))
            for i in range(count):
                unit = f"{node.name}/{device}{i}"
                numa = known[i] if known else i // per_numa
                gpu = unit if device == "gpu" and node.gpu_memory else ""
                slots += [
                    Slot(
                        unit if shares == 1 else f"{unit}/{k}",
                        node.name,
                        device,
                        numa,
                        gpu,
                        i,
                        unit,
                    )
                    for k in range(shares)
                ]
    return slots


class FreeSlots:
    """The free slots, so that finding one costs a heap operation instead of a scan of every
    slot: for each device, (device, node) and (device, node, NUMA node), a heap of the free
    slots' indices in `slots` order; an entry whose slot was taken since is dropped when it
    surfaces, and a slot is never in one heap twice, so the heaps stay as small as `slots`."""

    def __init__(self, slots: list[Slot]):
        self.slots = slots
        self.index = {s.id: i for i, s in enumerate(slots)}
        self.free = set(range(len(slots)))
        self.heaps: dict[tuple, list[int]] = {}
        for i, slot in enumerate(slots):
            for key in self._keys(slot):
                self.heaps.setdefault(key, []).append(i)  # ascending: already a heap
        self.queued = {key: set(heap) for key, heap in self.heaps.items()}

    @staticmethod
    def _keys(slot: Slot) -> tuple[tuple, ...]:
        keys = (slot.device,), (slot.device, slot.node), (slot.device, *slot.place)
        return (*keys, ("gpu", slot.gpu)) if slot.gpu else keys

    def take(self, slot: Slot) -> None:
        self.free.discard(self.index[slot.id])

    def release(self, slot: Slot) -> None:
        i = self.index[slot.id]
        self.free.add(i)
        for key in self._keys(slot):
            if i not in self.queued[key]:
                self.queued[key].add(i)
                heapq.heappush(self.heaps[key], i)

    def first(self, *key) -> Slot | None:
        """The first free slot in `slots` order among those of `key`."""
        heap, queued = self.heaps.get(key, []), self.queued.get(key, set())
        while heap and heap[0] not in self.free:
            queued.discard(heapq.heappop(heap))
        return self.slots[heap[0]] if heap else None
