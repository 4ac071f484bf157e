"""Scheduler traces of the tasks that ask for one (`spec.trace: true`).

Each attempt of such a task gets its own recording: the sched_trace BPF program filtered on
the task's leaf (its processes and their descendants, by cgroup id), attached after the
leaf is made and before the shim starts the workload, so its first event is in; streamed by
C into `<run dir>/sched.xht.partial` and, when the leaf goes (exit, cancel, kill), finished
and renamed `sched.xht` (fsynced): the file of `xhagent trace record`, for `trace export`,
`stats`, `heatmap` and `view`. One thread drains every recording's ring every POLL_S, and
finishes the recordings whose leaf went (`end_later`): what is left in the ring, the stacks
named, the final counts, the fsync and the rename happen there, not on the agent's loop,
which a long recording (hundreds of MB to scan for its stacks, then to sync) would hold up
for seconds. `TraceRecorded` says when the file is in place.
With `traceStacks: kernel|user|both` each switch-out's stacks are taken too: kernel ones named
when the recording ends from /proc/kallsyms, parsed once (in the drain thread, not the agent's
loop) and again only when /proc/modules changed; user ones from the mappings of their
processes, which the drain thread reads as the processes come (trace/ustacks.py).

At most MAX_RECORDINGS at once (each holds its own BPF programs and 16 MiB ring); a task
beyond them, or on a node where BPF does not load, runs untraced and the reason is its
event. After a kill -9 of the agent a recording is cut: its `.partial` file stays with the
records of up to a second before (the trace tools read it, saying it did not finish), and
the adopted task goes on untraced.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("xhagent")
# each holds its own BPF programs and a 16 MiB ring buffer (kernel memory) until it is
# finished: those being finished count too
MAX_RECORDINGS = 4
POLL_S = 0.1
FLUSH_S = 1.0  # the records C buffers reach the file at least this often
# With user stacks: a process's mappings must be read while it lives, and one that lives less
# than a poll is named by addresses only.
USER_POLL_S = 0.01
TRACE_FILE = "sched.xht"
PARTIAL = ".partial"


class _Symbols:
    """/proc/kallsyms parsed (0.3 s of Python) once for every recording with stacks, and
    again when /proc/modules changed (a module loaded or gone moves the kernel's text)."""

    def __init__(self):
        self.wanted = False
        self._lock = threading.Lock()
        self._symbols = None
        self._modules: str | None = None
        self._flag = threading.Lock()
        self._parsing = False

    def prepare(self) -> None:
        """Parse kallsyms in a thread of its own if a recording wants it and it is not
        yet, so that its end need not wait for it; the drain thread goes on meanwhile."""
        with self._flag:  # not self._lock, which a parse holds
            if not self.wanted or self._symbols is not None or self._parsing:
                return
            self._parsing = True
        threading.Thread(target=self._parse, name="xhagent-kallsyms", daemon=True).start()

    def _parse(self) -> None:
        try:
            self.get()
        except OSError:
            pass  # said by the recording that needs it, when it ends
        finally:
            with self._flag:
                self._parsing = False

    def get(self):
        from ...trace.stacks import KernelSymbols

        try:  # a module's name, size and address: not its use count, which changes often
            with open("/proc/modules", encoding="utf-8", errors="replace") as f:
                modules = "\n".join(
                    " ".join((p[0], p[1], p[-1])) for p in map(str.split, f) if len(p) >= 3
                )
        except OSError:
            modules = ""
        with self._lock:
            if self._symbols is None or modules != self._modules:
                self._symbols, self._modules = KernelSymbols.from_proc(), modules
            return self._symbols


@dataclass
class _Recording:
    task_id: str
    path: Path  # the finished file's
    fd: int
    st: object  # SchedTrace
    sink: object  # RingSink
    header: object  # trace.fmt.Header
    started: float
    maps: object = None  # trace.ustacks.ProcessMaps, with user stacks
    ended: float | None = None  # when its leaf went (monotonic): its length is to there


# what becomes of a finished recording: (its figures, None) or (None, why it failed)
Then = Callable[[dict | None, OSError | None], None]


class TaskTracer:
    """The recordings of the running tasks; begin() and end_later() from the agent's loop,
    the drain and the finishing in a thread of its own, collect() from the exporter's."""

    def __init__(self):
        self._lock = threading.Lock()
        self._live: dict[str, _Recording] = {}
        self._finishing: list[tuple[_Recording, Then]] = []
        self._events = self._lost = self._done = 0  # of finished recordings
        self._stop = threading.Event()
        self._nudge = threading.Event()  # a recording with user stacks began: look now
        self._thread: threading.Thread | None = None
        self._symbols = _Symbols()

    def begin(self, task_id: str, leaf: Path, run_dir: Path, stacks: str = "none") -> str | None:
        """Start recording the leaf's processes into run_dir (with their stacks at each
        switch-out when `stacks` is "kernel", "user" or "both"); None, or why it does not."""
        from ...bpf.sched_trace import TRACEPOINTS, SchedTrace
        from ...trace.fmt import write_header
        from ...trace.recorder import USER_KINDS, new_header, take_stacks
        from ...trace.ustacks import ProcessMaps

        with self._lock:
            if len(self._live) + len(self._finishing) >= MAX_RECORDINGS:
                return f"{MAX_RECORDINGS} traces are recording already (the most at once)"
        path = run_dir / TRACE_FILE
        partial = path.with_name(path.name + PARTIAL)
        try:
            st = SchedTrace()
        except Exception as exc:  # no BPF here (not root, no BTF, a refused load)
            return f"the sched_trace BPF program does not load: {exc}"
        fd = -1
        try:
            cgroup_id = st.filter_cgroup(str(leaf))
            extra = {}
            if stacks != "none":
                take_stacks(st, stacks)
                extra["stacks"] = {"kind": stacks}
                if stacks != "user":
                    self._symbols.wanted = True  # the drain thread parses kallsyms meanwhile
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
            header = new_header(
                {"kind": "cgroup", "cgroup": str(leaf), "cgroup_id": cgroup_id},
                st.flavour,
                TRACEPOINTS,
                task=task_id,
                **extra,
            )
            write_header(fd, header)
            sink = st.start(fd, TRACEPOINTS)
        except OSError as exc:
            st.close()
            if fd >= 0:
                os.close(fd)
                os.unlink(partial)  # made just now, by this call
            return f"{exc.filename or 'sched_trace'}: {exc.strerror or exc}"
        # a task's processes are all in its leaf: only user stacks need what the maps hold
        maps = ProcessMaps() if stacks in USER_KINDS else None
        rec = _Recording(task_id, path, fd, st, sink, header, time.monotonic(), maps)
        with self._lock:
            self._live[task_id] = rec
            self._running()
        if maps is not None:
            self._nudge.set()
        return None

    def _running(self) -> None:
        """The drain thread, started if it is not (under the lock)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="xhagent-traces", daemon=True)
            self._thread.start()

    def end_later(self, task_id: str, then: Then) -> bool:
        """The task's recording ends (its leaf went: no record comes after) and is finished
        by the drain thread, which calls `then` when the file is in place, or failed; False
        when the task had no recording."""
        with self._lock:
            rec = self._live.pop(task_id, None)
            if rec is None:
                return False
            rec.ended = time.monotonic()
            self._finishing.append((rec, then))
            self._running()
        return True

    def end(self, task_id: str) -> dict | None:
        """Finish the task's recording now, if it has one: {path, events, lost, seconds}.
        Only once the drain thread has stopped (close()): it reads a live recording's
        processes outside the lock."""
        with self._lock:  # the drain thread must not poll a sink being freed
            rec = self._live.pop(task_id, None)
        return None if rec is None else self._finish(rec)

    def _finish(self, rec: _Recording) -> dict:
        """The rest of the ring, the stacks named, the final counts, then fsync and rename
        (OSError when any fails; the `.partial` file stays). The recording is no longer
        live: nothing else touches it."""
        from ...trace.recorder import end_records

        elapsed = (rec.ended or time.monotonic()) - rec.started
        try:
            kind = (rec.header.meta.get("stacks") or {}).get("kind", "none")
            syms = self._symbols.get() if kind in ("kernel", "both") else None
            if rec.maps is not None:
                rec.maps.capture(rec.st.stacked_tgids())
            written, _, _ = end_records(
                rec.fd, rec.header, rec.sink, rec.st, elapsed, symbols=syms, maps=rec.maps
            )
            os.fsync(rec.fd)
        finally:
            rec.st.close()
            os.close(rec.fd)
            if rec.maps is not None:
                rec.maps.close()
        os.rename(rec.path.with_name(rec.path.name + PARTIAL), rec.path)
        lost = rec.header.lost
        with self._lock:
            self._events += written
            self._lost += lost
            self._done += 1
        return {"path": str(rec.path), "events": written, "lost": lost, "seconds": elapsed}

    def _finish_queued(self) -> None:
        while True:
            with self._lock:
                if not self._finishing:
                    return
                rec, then = self._finishing[0]
            try:
                done, error = self._finish(rec), None
            except OSError as exc:
                done, error = None, exc
            with self._lock:  # counted towards MAX_RECORDINGS until here
                self._finishing.pop(0)
            try:
                then(done, error)
            except Exception:  # the caller's (a store that refused the event): logged
                log.exception("traces: what follows %s's finished trace failed", rec.task_id)

    def recording(self, task_id: str) -> bool:
        with self._lock:
            return task_id in self._live

    def _drain(self) -> None:
        wait, flush_at = USER_POLL_S, time.monotonic() + FLUSH_S
        while not self._stop.is_set():
            self._nudge.wait(wait)
            self._nudge.clear()
            if self._stop.is_set():
                break
            wait, flush = POLL_S, time.monotonic() >= flush_at
            if flush:
                flush_at = time.monotonic() + FLUSH_S
            with self._lock:
                for rec in self._live.values():
                    try:
                        rec.sink.poll(0)
                        if flush:  # on disk, should the agent be killed
                            rec.sink.flush()
                    except OSError:
                        pass  # a full disk: counted as the sink's, seen again at its end
                users = [rec for rec in self._live.values() if rec.maps is not None]
            # Outside the lock, which the agent's loop takes to end a recording: only this
            # thread finishes one, so none of these is closed meanwhile.
            for rec in users:  # their processes' mappings, while they live
                rec.maps.capture(rec.st.stacked_tgids())
                wait = USER_POLL_S
            if not users:  # a parse holds the interpreter long enough to miss a process
                self._symbols.prepare()
            self._finish_queued()
            with self._lock:
                if not self._live and not self._finishing:
                    self._thread = None
                    return

    def close(self) -> None:
        """The agent stops: recordings of running tasks are finished as they are (the
        workloads go on untraced), and those ended before are finished now."""
        self._stop.set()
        self._nudge.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
        self._finish_queued()
        for task_id in list(self._live):
            try:
                self.end(task_id)
            except OSError:
                pass

    def collect(self):
        with self._lock:  # end() frees a recording's sink and maps under the same lock
            events, lost, done, live = self._events, self._lost, self._done, len(self._live)
            for rec in self._live.values():
                written, buffered, foreign = rec.sink.stats()
                events += written + buffered
                lost += sum(rec.st.dropped_per_cpu()) + foreign
        fams = (
            (
                CounterMetricFamily,
                "xhagent_trace_events",
                "Scheduler events of traced tasks recorded.",
                events,
            ),
            (
                CounterMetricFamily,
                "xhagent_trace_lost_events",
                "Scheduler events of traced tasks lost: a per-CPU ring buffer was full.",
                lost,
            ),
            (GaugeMetricFamily, "xhagent_traces_recording", "Task traces recording now.", live),
            (CounterMetricFamily, "xhagent_traces_finished", "Task traces finished.", done),
        )
        for kind, name, text, value in fams:
            fam = kind(name, text)
            fam.add_metric([], value)
            yield fam

    def describe(self):
        return []
