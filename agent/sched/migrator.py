"""The simulator's side of migration: each round, a snapshot for `migration.decide` (every
GPU's and TPU chip's load over the interval, the running jobs as placed tasks on the nodes'
inventory models) and where each move lands.

A device's load is the share of its slot-time busy since the last round (a GPU with four
shares running one job the whole interval is 0.25 loaded). The hard constraints are the
policies' rules, matched by each job's labels (`affinity`), checked by the placement core
on the nodes' models (`nodes.as_model`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..policy.policy import Match, Migration, SchedulingPolicy, choose
from ..policy.state import Allocation, Cluster, GpuShare
from ..policy.task import Requests, Task
from . import migration
from .fair import FairShare
from .job import Job
from .nodes import as_model
from .slots import NodeSpec, Slot


@dataclass(frozen=True)
class Unit:
    """One GPU or TPU chip of the simulation: its slots and its identity on the model."""

    node: str
    kind: str
    index: int  # on the node's model (an inventory GPU's own index)
    numa: int
    slots: tuple[Slot, ...]

    @property
    def id(self) -> str:
        return f"{self.node}/{self.kind}{self.index}"


class Migrator:
    def __init__(
        self,
        policy: Migration,
        nodes: list[NodeSpec],
        slots: list[Slot],
        rules: Iterable[SchedulingPolicy] = (),
        memory_modelled: bool = False,
    ):
        self.policy = policy
        self.rules = tuple(rules)
        self.memory_modelled = memory_modelled
        self.models = [as_model(n, slots) for n in nodes]
        by_name = {m.name: m for m in self.models}
        grouped: dict[str, list[Slot]] = {}
        for s in slots:
            if s.device in migration.ACCELERATORS:
                grouped.setdefault(s.unit, []).append(s)
        self.units: dict[str, Unit] = {}  # by the simulator's unit name
        for name, group in grouped.items():
            s = group[0]
            model = by_name[s.node]
            index = model.gpus[s.index].index if s.device == "gpu" else model.tpus[s.index].index
            self.units[name] = Unit(s.node, s.device, index, s.numa, tuple(group))
        self.by_id = {u.id: name for name, u in self.units.items()}  # Device.id -> unit name
        self.slot_unit = {s.id: s.unit for group in grouped.values() for s in group}
        self.busy: dict[str, int] = {u: 0 for u in self.units}  # slot-ns of finished stints
        self.seen: dict[str, int] = dict(self.busy)  # busy as of the last round
        self.last_ns: int | None = None
        self.moved: frozenset[str] = frozenset()  # moved in the last round
        self.left: dict[str, set[str]] = {}  # job -> devices it moved off, while it runs
        self.matches: dict[str, Match] = {}

    def ran(self, slot: Slot, ns: int) -> None:
        if slot.unit in self.busy:
            self.busy[slot.unit] += ns

    def round(
        self,
        now: int,
        running: dict[str, tuple[Job, int]],
        free: set[str],
        fair: FairShare,
    ) -> list[migration.Move]:
        """The moves at `now`; `running`: slot id -> (job, running since), `free`: free slot ids."""
        elapsed = now - self.last_ns if self.last_ns is not None else self.policy.interval_ns
        self.last_ns = now
        busy = dict(self.busy)
        placed: list[tuple[Job, Unit]] = []
        for slot_id, (job, since) in running.items():
            name = self.slot_unit.get(slot_id)
            if name is not None:  # not a CPU
                busy[name] += now - since
                placed.append((job, self.units[name]))
        devices = []
        for name, unit in self.units.items():
            load = (busy[name] - self.seen[name]) / (len(unit.slots) * max(elapsed, 1))
            room = any(s.id in free for s in unit.slots)
            devices.append(
                migration.Device(unit.node, unit.kind, unit.index, load, unit.numa, room)
            )
        self.seen = busy
        cluster = Cluster.of(self.models, (self._allocation(j, u) for j, u in placed))
        tasks = [
            migration.Running(self._task(j), self._match(j), u.id, j.runs_on) for j, u in placed
        ]
        moves = migration.decide(
            devices, tasks, cluster, self.policy, fair, elapsed, self.moved, self.left
        )
        self.moved = frozenset(m.task for m in moves)
        for m in moves:
            self.left.setdefault(m.task, set()).add(m.src)
        return moves

    def done(self, job: str) -> None:
        self.left.pop(job, None)
        self.matches.pop(job, None)

    def _task(self, job: Job) -> Task:
        gpu = job.device == "gpu"
        memory = job.gpu_memory if gpu and self.memory_modelled and job.gpu_memory else None
        return Task(
            job.name,
            job.device,
            labels=tuple(sorted(job.affinity.items())),
            requests=Requests(cpus=0, gpus=1 if gpu else None, gpu_memory=memory),
            priority=job.priority,
            migratable=job.migratable,
        )

    def _match(self, job: Job) -> Match:
        if job.name not in self.matches:
            self.matches[job.name] = choose(self.rules, job.affinity)
        return self.matches[job.name]

    def _allocation(self, job: Job, unit: Unit) -> Allocation:
        labels = tuple(sorted(job.affinity.items()))
        if unit.kind == "tpu":
            return Allocation(job.name, unit.node, (), 0, labels=labels, tpus=(unit.index,))
        memory = self._task(job).requests.gpu_memory
        whole = memory is None and len(unit.slots) == 1
        share = GpuShare(unit.index, memory or 0, whole)
        return Allocation(job.name, unit.node, (), 0, (share,), labels)
