"""eBPF probes: vmlinux BTF, a tp_btf/sched_switch program counting switches, its ring
buffer delivering our own switches, and bpf_send_signal_thread() preempting the main
thread from a cpu-clock perf event. Each loads and runs the real program (< ~1.5 s).
Then the programs the product runs, each loaded and attached as it would be:
sched_trace (`xhagent trace record`, a task's `trace: true`) and runqlat (the agent's
run-queue latency metrics)."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from ..errors import errno_reason
from .report import Item, fail, ok

BTF = Path("/sys/kernel/btf/vmlinux")


def _reason(step: str, exc: OSError) -> str:
    from ..bpf import BpfError

    # BpfError text already reads "STEP: -EPERM (...): libbpf: ..."
    text = exc.strerror if isinstance(exc, BpfError) and exc.strerror else errno_reason(exc)
    return f"{step}: {text}"


def _btf() -> Item:
    from ..bpf.loader import binding

    if not BTF.exists():
        return fail("ebpf.btf", f"{BTF} is missing: the kernel has no BTF (CONFIG_DEBUG_INFO_BTF)")
    try:
        ffi, lib = binding()
    except OSError as exc:
        return fail("ebpf.btf", _reason("load binding", exc))
    btf = lib.btf__load_vmlinux_btf()
    if btf == ffi.NULL:
        return fail("ebpf.btf", _reason("parse vmlinux BTF", OSError(ffi.errno, "")))
    try:
        return ok("ebpf.btf", size=BTF.stat().st_size, types=lib.btf__type_cnt(btf))
    finally:
        lib.btf__free(btf)


def _sched_switch() -> list[Item]:
    from ..bpf.sched_count import SchedCount, ping_pong

    names = ("ebpf.tp_btf_sched_switch", "ebpf.ringbuf")
    try:
        sc = SchedCount(target_tgid=os.getpid())
    except OSError as exc:
        reason = _reason("load and attach tp_btf/sched_switch (sched_count)", exc)
        return [fail(n, reason) for n in names]
    with sc:
        tids = ping_pong(100)
        records = sc.drain(timeout_ms=50)
        events = sc.switches()
    items = [
        ok(names[0], events=events)
        if events > 0
        else fail(names[0], "attached, but the per-CPU counter stayed 0 through a pipe ping-pong")
    ]
    ours = [r for r in records if r.prev_pid in tids or r.next_pid in tids]
    if ours:
        items.append(ok(names[1], records=len(ours)))
    else:
        items.append(
            fail(
                names[1],
                f"no ring-buffer record named our threads {tids} ({len(records)} records in all)",
                records=len(records),
            )
        )
    return items


def _send_signal() -> Item:
    from ..bpf.signal_probe import SignalProbe

    name = "ebpf.send_signal_thread"
    if threading.current_thread() is not threading.main_thread():
        return fail(name, "must run in the main thread (Python runs signal handlers only there)")
    hits = [0]

    def handler(signum, frame):
        hits[0] += 1

    old = signal.signal(signal.SIGURG, handler)
    try:
        try:
            probe = SignalProbe(threading.get_native_id(), period_ns=1_000_000)
        except OSError as exc:
            return fail(name, _reason("attach perf_event (signal_probe) to a cpu-clock event", exc))
        with probe:
            deadline = time.monotonic() + 1.0
            while not hits[0] and time.monotonic() < deadline:
                pass  # burn CPU: the cpu-clock event fires on our CPU time
            sent, failed, last = probe.results()
    finally:
        signal.signal(signal.SIGURG, old)
    if hits[0]:
        return ok(name, signals=hits[0])
    why = errno_reason(last, "last helper error") if failed else "the program never fired"
    return fail(
        name,
        f"no SIGURG reached the main thread within 1 s (sent={sent}, failed={failed}; {why})",
        signals=0,
    )


def _sched_trace() -> Item:
    from ..bpf.sched_trace import TRACEPOINTS, SchedTrace

    name = "ebpf.sched_trace"
    try:
        with SchedTrace() as st, tempfile.TemporaryFile() as sink:
            st.filter_pids([os.getpid()])
            st.take_stacks(kernel=True, user=True)
            ring = st.start(sink.fileno(), TRACEPOINTS)
            time.sleep(0.01)  # this thread leaves its CPU: a switch with its kernel stack
            ring.poll(0)
            ring.flush()
            frames, user = _own_stacks(st, sink)
            return ok(
                name,
                attach=st.flavour,
                events=list(TRACEPOINTS),
                stacks=[kind for kind, n in (("kernel", frames), ("user", user)) if n],
                kernel_stack_frames=frames,
                user_stack_frames=user,
            )
    except OSError as exc:
        return fail(
            name,
            _reason("load and attach sched_trace", exc)
            + ": `xhagent trace record` and tasks' `trace: true` cannot run here",
        )


def _own_stacks(st, sink) -> tuple[int, int]:
    """Frames of a kernel and of a user stack the program took of this thread's switch-outs
    (0: none)."""
    from ..trace.fmt import EV_SWITCH, RECORD, Event

    sink.seek(0)
    data = sink.read()
    kernel = user = 0
    for rec in RECORD.iter_unpack(data[: len(data) // RECORD.size * RECORD.size]):
        ev = Event(*rec)
        if ev.type == EV_SWITCH and ev.prev_pid == threading.get_native_id():
            kernel = kernel or (len(st.stack(ev.aux - 1)) if ev.aux else 0)
            user = user or (len(st.stack(ev.ustack - 1)) if ev.ustack else 0)
    return kernel, user


def _runqlat() -> Item:
    from ..bpf.runqlat import RunqLatency

    name = "ebpf.runqlat"
    try:
        RunqLatency().close()
    except OSError as exc:
        return fail(
            name, f"{exc.strerror or errno_reason(exc)}: the agent serves no run-queue latency"
        )
    return ok(name)


def probe() -> list[Item]:
    return [_btf(), *_sched_switch(), _send_signal(), _sched_trace(), _runqlat()]
