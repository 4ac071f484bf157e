"""xhagent.bpf on this kernel, for real: tp_btf/sched_switch counting and streaming
through a ring buffer, and SIGURG sent by a perf-event program."""

import errno
import os
import signal
import threading
import time

import pytest

from xhagent.bpf import BpfError, BpfObject, perf_event_open, possible_cpus
from xhagent.bpf.sched_count import SchedCount, ping_pong
from xhagent.bpf.signal_probe import SignalProbe

pytestmark = pytest.mark.host


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_sched_count_counts_switches():
    with SchedCount() as sc:
        before = sc.switches()
        ping_pong(100)
        after = sc.switches()
    # each of the 200 blocking reads switches a thread out
    assert after - before >= 200


def test_ringbuf_delivers_our_threads_switches():
    start = time.monotonic_ns()
    with SchedCount(target_tgid=os.getpid()) as sc:
        main_tid, peer_tid = ping_pong(100)
        ours = {int(t) for t in os.listdir("/proc/self/task")} | {peer_tid}
        records = sc.drain(timeout_ms=100)
        end = time.monotonic_ns()
        assert sc.dropped() == 0
    assert len(records) >= 200
    # the filter: every record names one of our threads ...
    strangers = [r for r in records if r.prev_pid not in ours and r.next_pid not in ours]
    assert not strangers, (ours, strangers[:5])
    # ... both sides of the ping-pong show up, switched out and in
    assert any(r.prev_pid == main_tid for r in records)
    assert any(r.next_pid == main_tid for r in records)
    assert any(r.prev_pid == peer_tid for r in records)
    # bpf_ktime_get_ns() is CLOCK_MONOTONIC; cpu is a real CPU
    assert all(start <= r.ts_ns <= end for r in records), (start, end, records[:3], records[-3:])
    assert all(r.cpu < possible_cpus() for r in records)


def test_ringbuf_follows_the_target_process_only():
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    with SchedCount() as sc:
        child = os.fork()
        if child == 0:  # echo 100 bytes back, then leave without running pytest's exit
            for _ in range(100):
                os.write(w2, os.read(r1, 1))
            os._exit(0)
        sc.set_target(child)
        for _ in range(100):
            os.write(w1, b"x")
            os.read(r2, 1)
        os.waitpid(child, 0)
        records = sc.drain(timeout_ms=100)
        sc.set_target(0)
        ping_pong(50)
        after_reset = sc.drain(timeout_ms=10)
    for fd in (r1, w1, r2, w2):
        os.close(fd)
    assert len(records) >= 100
    assert all(child in (r.prev_pid, r.next_pid) for r in records)
    assert after_reset == []


def test_signal_probe_preempts_a_cpu_bound_main_thread():
    assert threading.current_thread() is threading.main_thread()
    hits = []
    old = signal.signal(signal.SIGURG, lambda signum, frame: hits.append(time.monotonic()))
    try:
        with SignalProbe(threading.get_native_id(), period_ns=1_000_000) as probe:
            deadline = time.monotonic() + 2
            n = 0
            while len(hits) < 5 and time.monotonic() < deadline:
                n += 1  # pure bytecode: only the signal ends this loop early
            # the handled ones first: the probe goes on sending until it is closed
            handled = len(hits)
            sent, failed, last_err = probe.results()
    finally:
        signal.signal(signal.SIGURG, old)
    assert handled >= 5, f"sent={sent} failed={failed} last_err={last_err}"
    assert failed == 0 and sent >= handled


def test_signal_probe_ignores_other_threads():
    # The event follows a busy helper thread, the program targets the main thread:
    # the helper's samples must not be turned into signals.
    stop = threading.Event()
    tid = []

    def spin():
        tid.append(threading.get_native_id())
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin)
    t.start()
    while not tid:
        time.sleep(0.001)
    hits = []
    old = signal.signal(signal.SIGURG, lambda *a: hits.append(1))
    try:
        with SignalProbe(tid[0]) as probe:
            # Until this update the helper is the target and may be signalled.
            probe.obj.map("target").set_u32(0, threading.get_native_id())
            time.sleep(0.02)
            before = probe.results(), len(hits)
            time.sleep(0.2)
            after = probe.results(), len(hits)
    finally:
        stop.set()
        t.join()
        signal.signal(signal.SIGURG, old)
    assert after == before and after[0][1] == 0


def test_map_helpers_and_errors():
    with BpfObject("sched_count") as obj:
        target = obj.map("target")
        assert (target.key_size, target.value_size, target.max_entries) == (4, 4, 1)
        target.set_u32(0, 1234)
        assert target.get_int(0) == 1234
        assert target.lookup((5).to_bytes(4, "little")) is None  # out of range: ENOENT
        with pytest.raises(BpfError) as info:
            target.delete((0).to_bytes(4, "little"))  # array elements cannot be deleted
        assert info.value.errno == errno.EINVAL
        assert "delete from map target" in str(info.value)
        assert len(obj.map("counts").lookup_percpu((0).to_bytes(4, "little"))) == possible_cpus()
        assert [p.name for p in obj.programs()] == ["on_switch"]


def test_attach_errors_carry_libbpf_message():
    with BpfObject("signal_probe") as obj:
        with pytest.raises(BpfError) as info:
            obj.program("on_tick").attach_raw_tracepoint("no_such_tracepoint")
    assert info.value.errno == errno.EINVAL
    assert "attach raw_tp/no_such_tracepoint: -EINVAL" in str(info.value)
    assert "failed to attach to raw tracepoint" in str(info.value)
    with pytest.raises(BpfError) as info:
        perf_event_open(1, 9999)  # no such software event
    assert info.value.errno in (errno.EINVAL, errno.ENOENT)


def test_doctor_items_ok_quick_and_clean():
    from xhagent.doctor.bpf_probe import probe

    fds = _fds()
    start = time.monotonic()
    items = probe()
    elapsed = time.monotonic() - start
    assert {i.name: (i.ok, i.reason) for i in items} == {
        "ebpf.btf": (True, None),
        "ebpf.tp_btf_sched_switch": (True, None),
        "ebpf.ringbuf": (True, None),
        "ebpf.send_signal_thread": (True, None),
        "ebpf.sched_trace": (True, None),
        "ebpf.runqlat": (True, None),
    }
    detail = {i.name: i.detail for i in items}
    assert detail["ebpf.sched_trace"]["attach"] == "tp_btf"
    assert detail["ebpf.btf"]["size"] > 0
    assert detail["ebpf.tp_btf_sched_switch"]["events"] > 0
    assert detail["ebpf.ringbuf"]["records"] > 0
    assert detail["ebpf.send_signal_thread"]["signals"] > 0
    assert elapsed < 2
    assert _fds() == fds  # links, maps, programs, perf events all closed
    assert signal.getsignal(signal.SIGURG) in (signal.SIG_DFL, None)


def test_autoload_off_leaves_a_program_unloaded():
    with BpfObject("sched_count", load=False) as obj:
        prog = obj.program("on_switch")
        prog.set_autoload(False)
        obj.load()
        assert prog.fd < 0
        assert obj.map("events").fd >= 0  # maps are still created
