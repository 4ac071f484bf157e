"""runqlat.bpf.o: run-queue latency per cgroup, the time a task waits between becoming
runnable and getting a CPU, as log2 histograms keyed by cgroup v2 id. Like bcc's
`runqlat --cgroup`, but for many groups at once and without kernel headers.

What counts as waiting: from `sched_wakeup` / `sched_wakeup_new`, or from a
`sched_switch` that took the CPU from a task still runnable (preempted, yielded), to
the `sched_switch` that gives it a CPU again. Only tasks of watched groups are
counted, by exact id (a task in a child group of a watched one is not). A group is
the one a task is in when it gets the CPU.

Buckets: microseconds, log2: slot k counts waits of [2^k, 2^(k+1)) us, so its upper
bound is 2^(k+1) us (2 us, 4 us, ... 8.388608 s); the last slot only reaches +Inf.

    with RunqLatency() as rq:                  # loads and attaches; BpfError if it cannot
        cgid = rq.watch("/sys/fs/cgroup/xh/latency")  # a cgroup2 directory, or its id
        ...
        for cgid, h in rq.histograms().items():       # {cgroup id: Histogram}
            h.buckets   # ((le seconds, cumulative count), ..., (inf, count))
            h.sum, h.count
        rq.unwatch(cgid)                       # its histogram is dropped
    # leaving the block (or close()) detaches the programs and frees the maps

`Histogram.buckets` is what prometheus_client's HistogramMetricFamily.add_metric takes
as `buckets` once each `le` is formatted (`floatToGoString`), with `sum_value=h.sum`.
Counters only grow while a group stays watched; unwatching and watching again starts
it from zero (Prometheus treats that as a counter reset).

Costs: every context switch looks up the next task in a hash map of the tasks that
wait (a miss for tasks of unwatched groups); a watched task's wakeup, preemption and
switch-in also read its cgroup id and update its group's histogram with atomic adds.
Measured on a 2-vCPU VM (kernel.bpf_stats_enabled): ~120 ns a switch and ~145 ns a
wakeup with nothing watched, ~150 ns each with three watched hogs contending.
Bounded: MAX_GROUPS watched groups, 16384 waiting tasks of watched groups (LRU).
"""

from __future__ import annotations

import errno
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .layout import Mirror, Record, pick
from .loader import BpfError, BpfObject, ProgramLoader

# ebpf/runqlat.h; checked against the object's BTF by tests/unit/test_bpf_layout.py.
RUNQ_SLOTS = 24
HIST = Record("runq_hist", (("slots", f"{RUNQ_SLOTS}Q"), ("sum_ns", "Q")))
MIRROR = Mirror("runqlat", records=(HIST,), enums={"xh_runq_const": pick(globals(), "RUNQ_SLOTS")})
MAX_GROUPS = 1024  # max_entries of `hists` in ebpf/runqlat.bpf.c
PROGRAMS = ("on_wakeup", "on_wakeup_new", "on_switch")
BTF = Path("/sys/kernel/btf/vmlinux")
BPF_NOEXIST = 1
# Upper bound of each slot but the last, in seconds: 2^(k+1) microseconds.
UPPER_BOUNDS = tuple(2 ** (k + 1) / 1e6 for k in range(RUNQ_SLOTS - 1))


@dataclass(frozen=True)
class Histogram:
    """One group's waits as a Prometheus histogram: `buckets` are (le in seconds,
    cumulative count) in ascending order, the last one (inf, count)."""

    buckets: tuple[tuple[float, int], ...]
    sum: float  # seconds
    count: int

    @classmethod
    def from_slots(cls, slots: Sequence[int], sum_ns: int) -> Histogram:
        """The map's per-slot counts (struct runq_hist) made cumulative."""
        if len(slots) != RUNQ_SLOTS:
            raise ValueError(f"expected {RUNQ_SLOTS} slots, got {len(slots)}")
        buckets, total = [], 0
        for le, n in zip((*UPPER_BOUNDS, math.inf), slots, strict=True):
            total += n
            buckets.append((le, total))
        return cls(tuple(buckets), sum_ns / 1e9, total)


def cgroup_id(group: str | os.PathLike | int) -> int:
    """The id the kernel keys a cgroup v2 group by: its directory's inode number."""
    if isinstance(group, int):
        if group <= 0:
            raise ValueError(f"a cgroup id is a positive inode number, got {group}")
        return group
    path = Path(group)
    # A v1 directory has an inode too, but no task's cgroup v2 id would ever match it.
    if not (path / "cgroup.controllers").exists():
        raise ValueError(f"{path} is not a cgroup v2 directory (it has no cgroup.controllers)")
    return os.stat(path).st_ino


def _why(exc: BpfError) -> BpfError:
    if exc.errno == errno.EPERM:
        return BpfError(
            exc.errno, f"run-queue latency needs root (CAP_BPF and CAP_PERFMON): {exc.strerror}"
        )
    return exc


class RunqLatency(ProgramLoader):
    """Loaded and attached on construction; counts nothing until a group is watched."""

    def __init__(self):
        # CO-RE relocations and tp_btf attachment both need the kernel's own BTF; without
        # it libbpf fails far from the cause.
        if not BTF.exists():
            raise BpfError(
                errno.ENOENT,
                f"run-queue latency needs the kernel's BTF, and {BTF} is missing "
                "(a kernel built without CONFIG_DEBUG_INFO_BTF)",
            )
        self._watched: set[int] = set()
        try:
            self.obj = BpfObject("runqlat")
        except BpfError as exc:
            raise _why(exc) from None
        try:
            self._hists = self.obj.map("hists")
            for name in PROGRAMS:
                self.obj.program(name).attach()
        except BpfError as exc:
            self.obj.close()
            raise _why(exc) from None
        except BaseException:
            self.obj.close()
            raise

    def watch(self, group: str | os.PathLike | int) -> int:
        """Count the waits of tasks in this group (a cgroup2 directory or its id);
        returns the id. Watching a watched group keeps its counts."""
        cgid = cgroup_id(group)
        try:
            self._hists.update(struct.pack("<Q", cgid), bytes(HIST.size), BPF_NOEXIST)
        except BpfError as exc:
            if exc.errno == errno.E2BIG:
                raise BpfError(
                    exc.errno,
                    f"cannot watch cgroup {cgid}: {MAX_GROUPS} groups are watched already",
                ) from None
            if exc.errno != errno.EEXIST:
                raise
        self._watched.add(cgid)
        return cgid

    def unwatch(self, group: str | os.PathLike | int) -> bool:
        """Stop counting the group and drop its histogram; False if it was not watched.
        Takes the id as well as the path, for a group whose directory is gone."""
        cgid = group if isinstance(group, int) else cgroup_id(group)
        self._watched.discard(cgid)
        try:
            self._hists.delete(struct.pack("<Q", cgid))
        except BpfError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def watched(self) -> set[int]:
        return set(self._watched)

    def histogram(self, group: str | os.PathLike | int) -> Histogram | None:
        """The group's histogram, None if it is not watched."""
        cgid = group if isinstance(group, int) else cgroup_id(group)
        raw = self._hists.lookup(struct.pack("<Q", cgid))
        if raw is None:
            return None
        values = HIST.unpack(raw)
        return Histogram.from_slots(values[:RUNQ_SLOTS], values[RUNQ_SLOTS])

    def histograms(self) -> dict[int, Histogram]:
        """{cgroup id: Histogram} of every watched group."""
        out = {}
        for cgid in sorted(self._watched):
            h = self.histogram(cgid)
            if h is not None:
                out[cgid] = h
        return out

    def close(self) -> None:
        self._watched.clear()
        self.obj.close()
