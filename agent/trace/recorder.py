"""Record a trace: load sched_trace, set its filter, stream records into the file
in C, and stop at a deadline, when the traced command exits, or on SIGINT/SIGTERM.

With a command, it is started behind a gate (a pipe it waits on before exec), its
pid goes into the filter, and only then is it let go, so that no early event of the
command or its descendants is missed."""
from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from .fmt import Header, clock_offset_ns, finish_header, write_header

# Waits for one byte on fd argv[1], then becomes the command (same pid).
GATE = ("import os, sys\nfd = int(sys.argv[1])\nif os.read(fd, 1) != b'g':\n    sys.exit(125)\n"
        "os.close(fd)\ntry:\n    os.execvp(sys.argv[2], sys.argv[2:])\n"
        "except OSError as e:\n    print(f'xhagent trace: cannot run {sys.argv[2]}: {e.strerror}', "
        "file=sys.stderr)\n    sys.exit(127)\n")
POLL_MS = 100


@dataclass
class RecordResult:
    path: str
    records: int
    lost: int
    lost_per_cpu: list[int]
    foreign: int          # records of an unexpected size (never expected; counted as lost)
    elapsed_s: float
    exit_code: int | None = None
    meta: dict = field(default_factory=dict)


class _Stop:
    """SIGINT/SIGTERM end the recording cleanly instead of killing it mid-write."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, *_):
        self.requested = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _spawn_gated(command: list[str], stdout) -> tuple[subprocess.Popen, int]:
    r, w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-c", GATE, str(r), *command], pass_fds=(r,),
                                stdout=stdout)
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return proc, w


def record(path: str, *, duration: float | None = None, cgroup: str | None = None,
           pids: list[int] | tuple[int, ...] = (), command: list[str] | None = None,
           progress: Callable[[int, int, float], None] | None = None,
           system_wide: bool = False, command_stdout=None,
           events: tuple[str, ...] | None = None) -> RecordResult:
    """Trace into `path`. With `command`, its tasks are traced (all tasks if
    `system_wide`) until it exits; its stdout goes to `command_stdout` (inherited if None)."""
    from ..bpf.sched_trace import TRACEPOINTS, SchedTrace

    events = tuple(events or TRACEPOINTS)

    if cgroup is not None and not os.path.isdir(cgroup):
        raise FileNotFoundError(f"cgroup directory {cgroup} does not exist")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    proc = gate = None
    finished = False
    try:
        with SchedTrace() as st, _Stop() as stop:
            if cgroup is not None:
                filt = {"kind": "cgroup", "cgroup": os.path.abspath(cgroup),
                        "cgroup_id": st.filter_cgroup(cgroup)}
            elif pids or (command and not system_wide):
                filt = {"kind": "pids", "pids": list(pids)}
            else:
                filt = {"kind": "all"}
            if command:
                proc, gate = _spawn_gated(command, command_stdout)
                filt["command"] = list(command)
                filt["command_pid"] = proc.pid
            if filt["kind"] == "pids":
                st.filter_pids(list(pids) + ([proc.pid] if proc else []))
            header = Header(clock_offset_ns(), {
                "filter": filt, "hostname": socket.gethostname(), "kernel": platform.release(),
                "ncpus": os.cpu_count(), "started_realtime_ns": time.time_ns(),
                "attach": st.flavour, "record": "xh_sched_event", "events": list(events)})
            write_header(fd, header)
            sink = st.start(fd, events)
            t0 = time.monotonic()
            if gate is not None:
                os.write(gate, b"g")
                os.close(gate)
                gate = None
            next_report = t0 + 1.0
            while not stop.requested:
                sink.poll(POLL_MS)
                now = time.monotonic()
                if progress is not None and now >= next_report:
                    progress(sink.stats()[0] + sink.stats()[1], sum(st.dropped_per_cpu()), now - t0)
                    next_report = now + 1.0
                if duration is not None and now - t0 >= duration:
                    break
                if proc is not None and proc.poll() is not None:
                    break
            # records committed on other CPUs just before the stop
            time.sleep(0.02)
            sink.poll(0)
            sink.flush()
            elapsed = time.monotonic() - t0
            written, _, foreign = sink.stats()
            lost_per_cpu = st.dropped_per_cpu()
            header.records = written
            header.lost = sum(lost_per_cpu) + foreign
            header.meta.update(elapsed_ns=int(elapsed * 1e9), lost_per_cpu=lost_per_cpu,
                               foreign_records=foreign)
            finish_header(fd, header)
            finished = True
        # None if stopped by --duration or a signal: the command keeps running
        exit_code = proc.poll() if proc is not None else None
        return RecordResult(path, written, header.lost, lost_per_cpu, foreign, elapsed,
                            exit_code, header.meta)
    finally:
        if gate is not None:  # failed before the command was let go: it exits (125)
            os.close(gate)
            if proc is not None:
                proc.wait()
        os.close(fd)
        if not finished:  # no half-written trace behind a failure
            os.unlink(path)

