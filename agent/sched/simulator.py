"""Discrete-event simulation of one algorithm on a set of nodes.

Every slot (a CPU, GPU or TPU of a node) runs one job at a time; a job runs on a slot of
its device type and takes its `holds` resources when it is first dispatched, keeping them
until it completes. Events are arrivals, completions and, for time-sliced algorithms,
slice ends; after each batch of same-time events the ready queues are drained onto free
slots, and preemptive algorithms displace the worst-keyed running job when a waiting one
keys strictly better. Slot changes are committed through `snapshot.VersionedSlots`, so the
simulator exercises the same compare-and-set path the agent uses. Nothing is random here:
the same jobs give the same outcome.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from .fair import FairShare, twfs_slice_ns
from .job import Job
from .mlq import MultiLevel
from .pic import ResourceTable
from .queues import ReadyQueue, discipline, worst_first
from .snapshot import PreemptionDecision, VersionedSlots


class SimulationError(ValueError):
    pass


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpus: int = 1
    gpus: int = 0
    tpus: int = 0
    numa_nodes: int = 1
    cpu_numa: tuple[int, ...] = ()  # NUMA node of each CPU / GPU when known (inventory)
    gpu_numa: tuple[int, ...] = ()


@dataclass(frozen=True)
class Slot:
    id: str
    node: str
    device: str
    numa: int

    @property
    def place(self) -> tuple[str, int]:
        return (self.node, self.numa)


def slots_of(nodes: list[NodeSpec]) -> list[Slot]:
    """One slot per CPU, GPU and TPU, on its NUMA node where known; otherwise a node's
    devices are spread over its NUMA nodes in contiguous runs."""
    slots = []
    for node in nodes:
        for device, count, known in (
            ("cpu", node.cpus, node.cpu_numa),
            ("gpu", node.gpus, node.gpu_numa),
            ("tpu", node.tpus, ()),
        ):
            per_numa = max(1, -(-count // node.numa_nodes))
            slots += [
                Slot(
                    f"{node.name}/{device}{i}",
                    node.name,
                    device,
                    known[i] if known else i // per_numa,
                )
                for i in range(count)
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
        return (slot.device,), (slot.device, slot.node), (slot.device, *slot.place)

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


@dataclass
class JobRecord:
    job: Job
    first_start_ns: int | None = None
    finish_ns: int | None = None
    preemptions: int = 0
    migrations: int = 0

    @property
    def latency_ns(self) -> int:
        return self.finish_ns - self.job.arrival_ns

    @property
    def waiting_ns(self) -> int:
        return self.latency_ns - self.job.runtime_ns

    @property
    def missed(self) -> bool:
        return self.job.deadline_ns is not None and self.finish_ns > self.job.deadline_ns


@dataclass
class Outcome:
    algorithm: str
    records: list[JobRecord]
    slots: dict[str, int]  # device -> slot count
    busy_ns: dict[str, int]  # device -> slot-time spent running jobs
    makespan_ns: int
    preemptions: int = 0
    migrations: int = 0
    commits: int = 0
    intervals: list[tuple[str, str, int, int]] = field(
        default_factory=list
    )  # (slot, job, start, end)


# Events at one instant are all applied before the queues are drained, so their order
# only needs to be fixed for determinism.
_ARRIVE, _DONE, _SLICE = 0, 1, 2


class Simulation:
    def __init__(
        self,
        jobs: list[Job],
        nodes: list[NodeSpec],
        algorithm: str,
        levels: MultiLevel | None = None,
        migration_cost_ns: int = 2_000_000,
    ):
        names = [j.name for j in jobs]
        if len(set(names)) != len(names):
            raise SimulationError("job names must be unique")
        self.slots = slots_of(nodes)
        devices = {s.device for s in self.slots}
        for job in jobs:
            if job.device not in devices:
                raise SimulationError(
                    f"job {job.name} needs a {job.device} but the nodes have none"
                )
        self.jobs = sorted(jobs, key=lambda j: (j.arrival_ns, j.name))
        self.resources = ResourceTable()
        self.fair = FairShare(migration_cost_ns=migration_cost_ns)
        self.discipline = discipline(
            algorithm, resources=self.resources, fair=self.fair, levels=levels
        )
        self.queues = {d: ReadyQueue(self.discipline) for d in devices}
        # The running jobs in key order, so that neither a preemption victim (worst first,
        # per device) nor fair share's least vruntime (best first) needs a scan of them all.
        self.victims = {d: ReadyQueue(worst_first(self.discipline)) for d in devices}
        self.least_running = ReadyQueue(self.discipline)
        self.state = VersionedSlots({s.id: None for s in self.slots})
        self.by_id = {s.id: s for s in self.slots}
        self.records = {j.name: JobRecord(j) for j in jobs}
        self.remaining = {j.name: j.runtime_ns for j in jobs}
        self.running: dict[str, tuple[Job, int]] = {}  # slot id -> (job, running since)
        self.slot_of: dict[str, str] = {}  # job name -> slot id, while it runs
        self.busy: dict[str, int] = {d: 0 for d in devices}  # running jobs per device
        self.free = FreeSlots(self.slots)
        self.finished = 0
        self.last_place: dict[str, tuple[str, int]] = {}
        self.token: dict[str, int] = {}
        self.events: list = []
        self.seq = itertools.count()
        self.now = 0
        self.out = Outcome(
            algorithm,
            [],
            {d: sum(s.device == d for s in self.slots) for d in devices},
            {d: 0 for d in devices},
            0,
        )

    # -- events -------------------------------------------------------------------------
    def _at(self, t: int, kind: int, name: str, token: int = 0) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), name, token))

    def run(self, progress: Callable[[int, int], None] | None = None) -> Outcome:
        """Simulate every job; `progress(finished, total)` is called now and then."""
        for job in self.jobs:
            self._at(job.arrival_ns, _ARRIVE, job.name)
        by_name = {j.name: j for j in self.jobs}
        batches = 0
        while self.events:
            batches += 1
            if progress is not None and batches % 4096 == 0:
                progress(self.finished, len(self.jobs))
            self.now = self.events[0][0]
            while self.events and self.events[0][0] == self.now:
                _, kind, _, name, token = heapq.heappop(self.events)
                job = by_name[name]
                if kind == _ARRIVE:
                    self._ready(job)
                elif self.token.get(name) == token:
                    (self._complete if kind == _DONE else self._slice_end)(job)
            self._dispatch()
        self.out.records = [self.records[j.name] for j in self.jobs]
        self.out.makespan_ns = self.now - (self.jobs[0].arrival_ns if self.jobs else 0)
        self.out.commits = self.state.version
        return self.out

    def _ready(self, job: Job) -> None:
        if self.discipline.time_sliced:
            self.fair.enqueue(job)
        self.queues[job.device].push(job)

    def _complete(self, job: Job) -> None:
        self._stop(job)
        self.records[job.name].finish_ns = self.now
        self.finished += 1
        for woken in self.resources.release(job):
            self._ready(woken)
        self._rekey_holders()
        self.fair.forget(job)

    def _slice_end(self, job: Job) -> None:
        slot = self._stop(job)
        queue = self.queues[job.device]
        best = queue.peek()
        if best is not None and self.discipline.key(best) < self.discipline.key(job):
            self.records[job.name].preemptions += 1
            self.out.preemptions += 1
            queue.push(job)
        else:
            self._start(job, slot)

    # -- slots ----------------------------------------------------------------------------
    def _stop(self, job: Job) -> Slot:
        slot_id = self.slot_of.pop(job.name)
        _, since = self.running.pop(slot_id)
        self.busy[job.device] -= 1
        self.victims[job.device].remove(job)
        self.least_running.remove(job)
        self.free.release(self.by_id[slot_id])
        ran = self.now - since
        if ran:
            self.out.intervals.append((slot_id, job.name, since, self.now))
        self.remaining[job.name] -= ran
        self.out.busy_ns[job.device] += ran
        if self.discipline.time_sliced:
            self.fair.charge(job, ran)
        self.token[job.name] = self.token.get(job.name, 0) + 1
        self.state.commit(PreemptionDecision(evict=(job.name,)), self.state.version)
        return self.by_id[slot_id]

    def _start(self, job: Job, slot: Slot) -> None:
        record = self.records[job.name]
        if record.first_start_ns is None:
            record.first_start_ns = self.now
        previous = self.last_place.get(job.name)
        if previous is not None and previous != slot.place:
            record.migrations += 1
            self.out.migrations += 1
            if self.discipline.time_sliced:
                self.fair.migrate(job, previous, slot.place)
        self.last_place[job.name] = slot.place
        self.state.commit(PreemptionDecision(place={slot.id: job.name}), self.state.version)
        self.running[slot.id] = (job, self.now)
        self.slot_of[job.name] = slot.id
        self.busy[job.device] += 1
        self.victims[job.device].push(job)
        self.least_running.push(job)
        self.free.take(slot)
        token = self.token.get(job.name, 0) + 1
        self.token[job.name] = token
        self._at(self.now + self.remaining[job.name], _DONE, job.name, token)
        if self.discipline.time_sliced:
            quantum = twfs_slice_ns(job, self.busy[job.device] / self.out.slots[job.device])
            if quantum < self.remaining[job.name]:
                self._at(self.now + quantum, _SLICE, job.name, token)

    def _free_slot(self, job: Job) -> Slot | None:
        """A free slot of the job's device, where it last ran if possible, else on its node
        (the first such in slot order)."""
        last = self.last_place.get(job.name)
        if last is not None:
            slot = self.free.first(job.device, *last) or self.free.first(job.device, last[0])
            if slot is not None:
                return slot
        return self.free.first(job.device)

    def _victim(self, job: Job) -> Slot | None:
        """The running job of the same device that keys worst, if `job` keys strictly better."""
        worst = self.victims[job.device].peek()
        if worst is None or not self.discipline.key(job) < self.discipline.key(worst):
            return None
        return self.by_id[self.slot_of[worst.name]]

    def _rekey_holders(self) -> None:
        # Holders' keys move with the deadlines lent to them (edf-pic), queued or running.
        for holder in {h.name: h for h in self.resources.holder.values()}.values():
            self.queues[holder.device].update(holder)
            self.victims[holder.device].update(holder)
            self.least_running.update(holder)

    def _dispatch(self) -> None:
        for queue in self.queues.values():
            while (job := queue.peek()) is not None:
                started = self.records[job.name].first_start_ns is not None
                if not started and self.resources.blockers(job):
                    queue.pop()
                    self.resources.acquire(job)  # registers the wait, lends the deadline
                    self._rekey_holders()
                    continue
                slot = self._free_slot(job)
                if slot is None and self.discipline.preemptive:
                    slot = self._victim(job)
                    if slot is not None:
                        victim = self.running[slot.id][0]
                        self._stop(victim)
                        self.records[victim.name].preemptions += 1
                        self.out.preemptions += 1
                        queue.push(victim)
                if slot is None:
                    break
                queue.pop()
                if not started:
                    self.resources.acquire(job)
                self._start(job, slot)
            if self.discipline.time_sliced:
                self.fair.advance(
                    self.fair.key(j)
                    for j in (self.least_running.peek(), queue.peek())
                    if j is not None
                )
