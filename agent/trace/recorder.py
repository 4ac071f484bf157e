"""Record a trace: load sched_trace, set its filter, stream records into the file
in C, and stop at a deadline, when the traced command exits, or on SIGINT/SIGTERM/SIGHUP.

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
from collections.abc import Callable
from dataclasses import dataclass, field

from ..fdlimit import room_for_fds
from ..outputs import atomic_output
from ..signals import TERMINATING, forward_signals, terminate_on_signals
from .fmt import (
    EV_SWITCH,
    PREFIX,
    RECORD,
    Header,
    append_stacks,
    clock_offset_ns,
    comm,
    finish_header,
    write_header,
)
from .ustacks import MAX_FILES, ProcessMaps

# Waits for one byte on fd argv[1], then becomes the command (same pid).
GATE = (
    "import os, sys\nfd = int(sys.argv[1])\nif os.read(fd, 1) != b'g':\n    sys.exit(125)\n"
    "os.close(fd)\ntry:\n    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as e:\n    print(f'xhagent trace: cannot run {sys.argv[2]}: {e.strerror}', "
    "file=sys.stderr)\n    sys.exit(127)\n"
)
POLL_MS = 100
STACKS_POLL_MS = 10
MAX_USER_STACKS = 65536  # (process, stack) pairs a trace names; the rest keep no frames
STACK_KINDS = ("none", "kernel", "user", "both")  # trace record --stacks, traceStacks
USER_KINDS = ("user", "both")


def take_stacks(st, kind: str) -> None:
    """Have the recorder `st` (SchedTrace) take the stacks of `kind` (STACK_KINDS)."""
    if kind not in STACK_KINDS:
        raise ValueError(f"stacks: {kind!r} is not one of {', '.join(STACK_KINDS)}")
    if kind != "none":
        st.take_stacks(kernel=kind in ("kernel", "both"), user=kind in USER_KINDS)


MAX_PID = 2**32 - 1  # the BPF filter keys pids as u32


@dataclass
class RecordResult:
    path: str
    records: int
    lost: int
    lost_per_cpu: list[int]
    foreign: int  # records of an unexpected size (never expected; counted as lost)
    elapsed_s: float
    exit_code: int | None = None
    meta: dict = field(default_factory=dict)


class _Stop:
    """Inside the recording loop SIGINT/SIGTERM/SIGHUP end the recording, which is then
    finished and kept (Ctrl-C is how a recording without a command is meant to stop)."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        for sig in TERMINATING:
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, *_):
        self.requested = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def shell_status(returncode: int) -> int:
    """Popen's returncode as a shell reports it: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _spawn_gated(command: list[str], stdout) -> tuple[subprocess.Popen, int]:
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", GATE, str(r), *command], pass_fds=(r,), stdout=stdout
        )
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return proc, w


def check_cgroup(path: str) -> str:
    """`path` as an absolute cgroup v2 directory, or ValueError saying why not. The BPF
    filter matches a cgroup id (the directory's inode) in the v2 hierarchy: a v1 directory
    or a plain one would match the v2 root (everything) or nothing."""
    from ..cgroups.mounts import CGROUP2_SUPER_MAGIC, fs_magic

    if not os.path.isdir(path):
        raise ValueError(f"--cgroup {path}: not a directory")
    try:
        magic = fs_magic(path)
    except OSError as exc:
        raise ValueError(f"--cgroup {path}: {exc.strerror}") from None
    if magic != CGROUP2_SUPER_MAGIC:
        raise ValueError(
            f"--cgroup {path}: not a cgroup v2 directory (file system magic "
            f"{magic:#x}, cgroup2 is {CGROUP2_SUPER_MAGIC:#x})"
        )
    return os.path.abspath(path)


def check_pid(pid: int) -> int:
    """A pid the filter can hold (u32, not 0) of a process that exists, or ValueError."""
    if not 1 <= pid <= MAX_PID:
        raise ValueError(f"--pid {pid}: out of range (1..{MAX_PID})")
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # pid_t is 32-bit signed: above it, none
        raise ValueError(f"--pid {pid}: no such process") from None
    except PermissionError:
        pass  # it exists
    return pid


def new_header(filt: dict, flavour: str, events, **meta) -> Header:
    """The header of a recording about to start (its counts come at end_records)."""
    return Header(
        clock_offset_ns(),
        {
            "filter": filt,
            **meta,
            "hostname": socket.gethostname(),
            "kernel": platform.release(),
            "ncpus": os.cpu_count(),
            "started_realtime_ns": time.time_ns(),
            "attach": flavour,
            "record": "xh_sched_event",
            "events": list(events),
        },
    )


def end_records(
    fd: int, header: Header, sink, st, elapsed: float, symbols=None, maps=None
) -> tuple[int, list[int], int]:
    """Write what the ring still holds and the header's final counts (the file is then
    complete); (records written, lost per CPU, foreign records). A recording with stacks
    gets its stacks section, named with `symbols` (stacks.KernelSymbols; default: read now)
    and, for user stacks, the processes' mappings `maps` (ustacks.ProcessMaps) captured
    while it recorded."""
    sink.poll(0)
    sink.flush()
    written, _, foreign = sink.stats()
    lost_per_cpu = st.dropped_per_cpu()
    header.records = written
    header.lost = sum(lost_per_cpu) + foreign
    header.meta.update(
        elapsed_ns=int(elapsed * 1e9), lost_per_cpu=lost_per_cpu, foreign_records=foreign
    )
    if "stacks" in header.meta:
        end_stacks(fd, header, st, symbols, maps)
    finish_header(fd, header)
    return written, lost_per_cpu, foreign


# where a record's type and ustack (u16), aux and prev_tgid (u32), prev_comm (16 bytes) lie
_OFFSET = {name: at for name, at, _, _ in RECORD.members()}
_COMM = slice(_OFFSET["prev_comm"], _OFFSET["prev_comm"] + 16)


def _stacks_used(m, data_offset: int, records: int) -> tuple[set[int], dict]:
    """The kernel stack ids of the switch records, and each (tgid, user stack id) with the
    comm of the first record naming it."""
    n = RECORD.size
    view = memoryview(m)[data_offset : data_offset + records * n]
    try:
        types = view.cast("H")[_OFFSET["type"] // 2 :: n // 2]
        ustacks = view.cast("H")[_OFFSET["ustack"] // 2 :: n // 2]
        auxes = view.cast("I")[_OFFSET["aux"] // 4 :: n // 4]
        tgids = view.cast("I")[_OFFSET["prev_tgid"] // 4 :: n // 4]
        kernel: set[int] = set()
        user: dict[tuple[int, int], str] = {}
        for i, (t, a, u) in enumerate(zip(types, auxes, ustacks, strict=True)):
            if t != EV_SWITCH:
                continue
            if a:
                kernel.add(a - 1)
            if u and (key := (tgids[i], u - 1)) not in user:
                at = i * n
                user[key] = comm(bytes(view[at + _COMM.start : at + _COMM.stop]))
        return kernel, user
    finally:
        del types, ustacks, auxes, tgids
        view.release()


def _by_cgroup(cgroups: dict[int, str]) -> dict[str, list[int]]:
    """cgroup path -> the processes seen in it, for `trace offcpu --cgroup`."""
    out: dict[str, list[int]] = {}
    for tgid, path in sorted(cgroups.items()):
        out.setdefault(path, []).append(tgid)
    return out


def end_stacks(fd: int, header: Header, st, symbols=None, maps=None) -> None:
    """Name the stacks the records use (kernel frames from kallsyms, now, while the kernel
    that made them runs; user frames from the processes' mappings, `maps`) and append them
    as the trace's stacks section."""
    import mmap

    from .stacks import KernelSymbols, encode_section, kernel_frames
    from .ustacks import ProcessMaps, UserSymbols

    data_offset = PREFIX.size + PREFIX.unpack(os.pread(fd, PREFIX.size, 0))[-1]
    kernel_ids: set[int] = set()
    user_keys: dict = {}
    if header.records:
        end = data_offset + header.records * RECORD.size
        with mmap.mmap(fd, end, prot=mmap.PROT_READ) as m:
            kernel_ids, user_keys = _stacks_used(m, data_offset, header.records)
    meta = header.meta["stacks"]
    kernel = {}
    if meta.get("kind") != "user":
        syms = symbols if symbols is not None else KernelSymbols.from_proc()
        kernel = kernel_frames(kernel_ids, st.stack, syms)
        meta.update(symbols="hidden" if syms.hidden else "kallsyms")
    maps = maps if maps is not None else ProcessMaps()
    names = UserSymbols(maps)
    # a stack id names one stack in each process that took it: bounded, whatever forks
    kept = sorted(user_keys.items())[:MAX_USER_STACKS]
    user = {(tgid, sid): names.frames(tgid, name, st.stack(sid)) for (tgid, sid), name in kept}
    meta.update(stacks=len(kernel_ids), lost=st.stacks_lost(), cgroups=_by_cgroup(maps.cgroups))
    if meta.get("kind") != "kernel":
        meta.update(
            user_stacks=len(user),
            user_stacks_unnamed=len(user_keys) - len(user),
            processes=len(maps.images),
            processes_missed=maps.missed,
            files=len(maps.files),
            files_unread=len(maps.unread),
            builds=dict(sorted(names.builds.items())),  # what named the user frames
        )
    append_stacks(fd, header, data_offset, encode_section(kernel, user))


def record(
    path: str,
    *,
    duration: float | None = None,
    cgroup: str | None = None,
    pids: list[int] | tuple[int, ...] = (),
    command: list[str] | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    system_wide: bool = False,
    command_stdout=None,
    events: tuple[str, ...] | None = None,
    stacks: str = "none",
) -> RecordResult:
    """Trace into `path`. With `command`, its tasks are traced (all tasks if
    `system_wide`) until it exits; its stdout goes to `command_stdout` (inherited if None).

    `stacks`: "kernel", "user" or "both" takes each traced task's kernel stack, user stack or
    both at its switch-out ("none": no stacks); the cgroups of the processes whose stacks
    were taken, and with user stacks their mappings, are read as they come (ustacks.py).

    `path` is replaced only by a finished trace (see output.py). A SIGINT/SIGTERM/SIGHUP
    before recording starts raises Terminated and leaves nothing; during the recording it
    is forwarded to the command, which is waited for, or, without a command, ends the
    recording, which is finished and kept."""
    from ..bpf.sched_trace import TRACEPOINTS, SchedTrace

    events = tuple(events or TRACEPOINTS)
    if command is not None and not (command and command[0]):
        raise ValueError("the command is empty")
    cgroup = check_cgroup(cgroup) if cgroup is not None else None
    pids = [check_pid(p) for p in pids]

    proc = gate = None
    user = stacks in USER_KINDS
    if user:
        room_for_fds(MAX_FILES)  # the mapped files, held open until the stacks are named
    # with stacks, look for new processes often: one that lives less than a poll is gone
    # before its cgroup and mappings are read
    poll_ms = STACKS_POLL_MS if stacks != "none" else POLL_MS
    maps = ProcessMaps(mappings=user)
    with terminate_on_signals(), atomic_output(path, 0o644) as out, maps:
        try:
            with SchedTrace() as st:
                if cgroup is not None:
                    filt = {
                        "kind": "cgroup",
                        "cgroup": cgroup,
                        "cgroup_id": st.filter_cgroup(cgroup),
                    }
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
                extra = {}
                if stacks != "none":
                    take_stacks(st, stacks)
                    extra["stacks"] = {"kind": stacks}
                header = new_header(filt, st.flavour, events, **extra)
                write_header(out.fd, header)
                sink = st.start(out.fd, events)
                # from here on a signal ends the recording (or goes to the command), and
                # the file is finished: the handlers stay until it is in place
                with forward_signals(proc.pid) if proc else _Stop() as stop:
                    t0 = time.monotonic()
                    if gate is not None:
                        os.write(gate, b"g")
                        os.close(gate)
                        gate = None
                    next_report = t0 + 1.0
                    # with a command, a signal goes to it and its exit ends the loop
                    while proc is not None or not stop.requested:
                        sink.poll(poll_ms)
                        if stacks != "none":
                            maps.capture(st.stacked_tgids())
                        now = time.monotonic()
                        if progress is not None and now >= next_report:
                            progress(
                                sink.stats()[0] + sink.stats()[1],
                                sum(st.dropped_per_cpu()),
                                now - t0,
                            )
                            next_report = now + 1.0
                        if duration is not None and now - t0 >= duration:
                            break
                        if proc is not None and proc.poll() is not None:
                            break
                    # records committed on other CPUs just before the stop
                    time.sleep(0.02)
                    if stacks != "none":
                        maps.capture(st.stacked_tgids())
                    written, lost_per_cpu, foreign = end_records(
                        out.fd, header, sink, st, time.monotonic() - t0, maps=maps
                    )
                    elapsed = header.meta["elapsed_ns"] / 1e9
                    out.commit()
        finally:
            if gate is not None:  # failed before the command was let go: it exits (125)
                os.close(gate)
                proc.wait()
    # None if stopped by --duration: the command keeps running
    exit_code = (
        shell_status(proc.returncode) if proc is not None and proc.returncode is not None else None
    )
    return RecordResult(
        path, written, header.lost, lost_per_cpu, foreign, elapsed, exit_code, header.meta
    )
