"""sched_trace.bpf.o: sched_switch / sched_waking / sched_wakeup(_new) / sched_process_exit /
sched_process_fork records in a ring buffer, written to a file by C (RingSink) so
that Python never handles events one by one.

Filters: everything, a cgroup v2 subtree (by cgroup id = the directory's inode,
descendants included), or a set of pids/tgids that grows with forks of traced tasks.
"""

from __future__ import annotations

import errno
import os
import struct

from .layout import Mirror, pick
from .loader import BpfError, BpfObject, ProgramLoader, binding, format_error

RECORD_SIZE = 80  # struct xh_sched_event; agent/trace/fmt.py RECORD describes it
# The enums of ebpf/sched_trace.h that index the maps; checked against the object's
# BTF by tests/unit/test_bpf_layout.py.
FILTER_ALL, FILTER_CGROUP, FILTER_PIDS = 0, 1, 2
CFG_MODE, CFG_CGROUP_ID, CFG_WAKEUP_BYTES, CFG_STACKS = 0, 1, 2, 3
STACKS_KERNEL, STACKS_USER, STACKS_ONLY = 1, 2, 4
COUNT_EVENTS, COUNT_DROPPED, COUNT_STACKS_LOST = 0, 1, 2
MIRROR = Mirror(
    "sched_trace",
    enums={
        "xh_trace_filter": pick(globals(), "FILTER_ALL FILTER_CGROUP FILTER_PIDS"),
        "xh_trace_cfg": pick(globals(), "CFG_MODE CFG_CGROUP_ID CFG_WAKEUP_BYTES CFG_STACKS"),
        "xh_trace_stacks": pick(globals(), "STACKS_KERNEL STACKS_USER STACKS_ONLY"),
        "xh_trace_count": pick(globals(), "COUNT_EVENTS COUNT_DROPPED COUNT_STACKS_LOST"),
    },
)
STACK_DEPTH = 127  # XH_STACK_DEPTH: frames of a stacks value
TRACEPOINTS = ("switch", "waking", "wakeup", "wakeup_new", "exit", "fork")
WAKEUP_BYTES = 256 * 1024  # wake the consumer once this much waits in the ring


class RingSink:
    """A ring buffer whose records C appends to `fd` in large writes. Freed by its
    BpfObject's close(); call flush() before that to keep the buffered tail."""

    def __init__(self, obj: BpfObject, map_name: str, fd: int, record_size: int):
        ffi, lib = binding()
        m = obj.map(map_name)
        self.name = m.name
        self._ptr = lib.xh_rb_new_sink(m.fd, fd, record_size)
        if self._ptr == ffi.NULL:
            err = ffi.errno or errno.EINVAL
            raise BpfError(err, format_error(f"ring buffer sink on map {m.name}", err))
        obj._rings.append(self)  # BpfObject.close() frees it before the maps go

    def poll(self, timeout_ms: int) -> int:
        """Wait up to timeout_ms for a wakeup, then write whatever is in the ring
        (producers skip wakeups for small batches); returns records consumed."""
        lib = binding()[1]
        ret = lib.xh_rb_poll(self._ptr, timeout_ms) if timeout_ms else 0
        if ret >= 0 or ret == -errno.EINTR:
            more = lib.xh_rb_consume(self._ptr)
            ret = more if more < 0 else max(ret, 0) + more
        if ret < 0:
            raise BpfError(-ret, format_error(f"write records of ring buffer {self.name}", ret))
        return ret

    def flush(self) -> None:
        ret = binding()[1].xh_rb_flush(self._ptr)
        if ret < 0:
            raise BpfError(-ret, format_error(f"write records of ring buffer {self.name}", ret))

    def stats(self) -> tuple[int, int, int]:
        """(records written, records buffered, records of a foreign size skipped)."""
        ffi, lib = binding()
        out = [ffi.new("uint64_t *") for _ in range(3)]
        lib.xh_rb_sink_stats(self._ptr, *out)
        return tuple(int(v[0]) for v in out)

    def free(self) -> None:
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            binding()[1].xh_rb_free(ptr)


class SchedTrace(ProgramLoader):
    """Loaded on construction; configure the filter, then start(fd) attaches the
    programs and streams records into fd. Use as a context manager to detach."""

    def __init__(self, flavour: str | None = None):
        """flavour: "tp_btf" or "raw_tp" to force one (tests); default tp_btf, else raw_tp."""
        self.obj = BpfObject("sched_trace", load=False)
        try:
            self.flavour = self._load(flavour)
            self._config = self.obj.map("trace_config")
            self._pids = self.obj.map("pids")
            self._counts = self.obj.map("counts")
            self.sink: RingSink | None = None
            self._mode = FILTER_ALL
            self._config.update(
                struct.pack("<I", CFG_WAKEUP_BYTES), struct.pack("<Q", WAKEUP_BYTES)
            )
        except BaseException:
            self.obj.close()
            raise

    def _load(self, flavour: str | None) -> str:
        """tp_btf where the kernel has BTF for the tracepoints, else raw_tp."""
        if flavour == "raw_tp":
            self._only("raw_")
            self.obj.load()
            return flavour
        try:
            self._only("btf_")
            self.obj.load()
            return "tp_btf"
        except BpfError as first:
            if flavour == "tp_btf":
                raise
            self.obj = BpfObject("sched_trace", load=False)
            self._only("raw_")
            try:
                self.obj.load()
            except BpfError as second:
                raise BpfError(
                    second.errno, f"{first.strerror}; raw_tp fallback: {second.strerror}"
                ) from None
            return "raw_tp"

    def _only(self, prefix: str) -> None:
        for prog in self.obj.programs():
            prog.set_autoload(prog.name.startswith(prefix))

    def filter_cgroup(self, cgroup_dir: str) -> int:
        """Trace tasks in the cgroup v2 directory and its descendants; returns the id."""
        cgid = os.stat(cgroup_dir).st_ino
        self._set(CFG_CGROUP_ID, cgid)
        self._set(CFG_MODE, FILTER_CGROUP)
        self._mode = FILTER_CGROUP
        return cgid

    def filter_pids(self, pids: list[int]) -> None:
        """Trace these pids/tgids and whatever they fork from now on."""
        for pid in pids:
            self.add_pid(pid)
        self._set(CFG_MODE, FILTER_PIDS)
        self._mode = FILTER_PIDS

    def take_stacks(self, kernel: bool = True, user: bool = False, only: bool = False) -> None:
        """Record the kernel stack (a switch's aux: its id + 1) and the user stack (its
        ustack) of each traced task switched out; read them with stack() before close(),
        and the processes whose stacks were taken with stacked_tgids() while they live.
        `only`: take them and record no switch at all (what the stacks alone cost)."""
        kinds = (STACKS_KERNEL if kernel else 0) | (STACKS_USER if user else 0)
        self._set(CFG_STACKS, kinds | (STACKS_ONLY if only else 0))

    def stacked_tgids(self) -> list[int]:
        """The processes whose stacks were taken since the last call (each forgotten here,
        so that the next call names only those seen again)."""
        m = self.obj.map("tgids")
        out = []
        for key in m.keys():
            try:
                m.delete(key)
            except BpfError:
                continue  # (deleted meanwhile)
            out.append(struct.unpack("<I", key)[0])
        return out

    def stack(self, stack_id: int) -> list[int]:
        """The return addresses of stack `stack_id`, innermost first; [] if it is gone."""
        raw = self.obj.map("stacks").lookup(struct.pack("<I", stack_id))
        if raw is None:
            return []
        ips = struct.unpack(f"<{STACK_DEPTH}Q", raw)
        return list(ips[: ips.index(0)] if 0 in ips else ips)

    def stacks_lost(self) -> int:
        """Stacks not recorded: the map was full or their hash bucket held another."""
        return self._counts.sum_percpu(COUNT_STACKS_LOST)

    def add_pid(self, pid: int) -> None:
        self._pids.update(struct.pack("<I", pid), b"\x01")

    def _set(self, idx: int, value: int) -> None:
        self._config.update(struct.pack("<I", idx), struct.pack("<Q", value))

    def start(self, fd: int, events: tuple[str, ...] = TRACEPOINTS) -> RingSink:
        """Attach the programs of `events` (names from TRACEPOINTS; an event left out
        costs nothing) and stream records into fd. "fork" is always attached with a
        pid filter: it is what follows the traced tasks' children."""
        unknown = set(events) - set(TRACEPOINTS)
        if unknown:
            raise ValueError(
                f"unknown event(s) {', '.join(sorted(unknown))}; known: {', '.join(TRACEPOINTS)}"
            )
        if self._mode == FILTER_PIDS:
            events = (*events, "fork")
        self.sink = RingSink(self.obj, "events", fd, RECORD_SIZE)
        prefix = "btf_" if self.flavour == "tp_btf" else "raw_"
        for tp in TRACEPOINTS:
            if tp in events:
                self.obj.program(prefix + tp).attach()
        return self.sink

    def emitted(self) -> int:
        return self._counts.sum_percpu(COUNT_EVENTS)

    def dropped_per_cpu(self) -> list[int]:
        """Records lost because the ring buffer was full, per CPU."""
        key = struct.pack("<I", COUNT_DROPPED)
        return [int.from_bytes(v, "little") for v in self._counts.lookup_percpu(key)]
