"""Inside the guest VM (Debian's 6.1 kernel): the BPF objects built against the host's
6.18 BTF load through CO-RE relocation, tp_btf/sched_switch delivers events, and the
programs the product runs (sched_trace, runqlat) load, attach and record here too."""

import json
import os
import platform
import subprocess
import sys
import time

import pytest

from xhagent.bpf.sched_count import SchedCount, ping_pong
from xhagent.doctor.bpf_probe import probe

pytestmark = pytest.mark.kernel
# runqlat attached and detached under load this many times (tools/vmtest's TCG note)
ATTACHES = 6


def test_tp_btf_sched_switch_delivers_events_in_guest():
    with SchedCount(target_tgid=os.getpid()) as sc:
        main_tid, peer_tid = ping_pong(100)
        records = sc.drain(timeout_ms=200)
        switches = sc.switches()
    assert switches >= 200, platform.release()
    assert any(r.prev_pid == main_tid for r in records)
    assert any(r.prev_pid == peer_tid for r in records)
    ours = {int(t) for t in os.listdir("/proc/self/task")} | {peer_tid}
    assert all(r.prev_pid in ours or r.next_pid in ours for r in records)


def test_doctor_ebpf_items_ok_in_guest():
    """Every eBPF item, the programs the product runs included: on 6.1, runqlat loads only
    because its histogram index is checked again at the access (ebpf/runqlat.bpf.c)."""
    items = {i.name: i for i in probe()}
    bad = {n: i.reason for n, i in items.items() if not i.ok}
    assert not bad, f"{platform.release()}: {bad}"
    assert {"ebpf.sched_trace", "ebpf.runqlat"} <= set(items)
    assert items["ebpf.sched_trace"].detail["stacks"] == ["kernel", "user"], items[
        "ebpf.sched_trace"
    ]


def test_stacks_on_6_1_name_where_a_sleep_waits(tmp_path):
    """trace record --stacks both on Debian's 6.1: a sleeping command's switch-out has its
    kernel stack, named from this kernel's kallsyms, in the nanosleep path, and its user
    stack in the C library's nanosleep, named from the library's symbols."""
    out = tmp_path / "s.xht"
    rec = subprocess.run(
        [sys.executable, "-m", "xhagent.cli", "trace", "record", "--stacks", "both"]
        # 0.3 s: the recorder reads a process's mappings while it lives, and under the
        # emulator its own loop is slow enough to miss a 50 ms one
        + ["-o", str(out), "--json", "--", "sh", "-c", "sleep 0.3; sleep 0.3; sleep 0.3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rec.returncode == 0, rec.stderr
    from xhagent.trace.fmt import EV_SWITCH, TraceFile, comm

    trace = TraceFile(out)
    stacks = trace.stacks()
    asleep = [e for e in trace if e.type == EV_SWITCH and e.prev_state & 1 and e.aux]
    kernel = [[f.symbol for f in stacks.kernel.get(e.aux - 1, [])] for e in asleep]
    assert kernel, platform.release()
    assert any(s[:1] == ["__schedule"] and "do_nanosleep" in s for s in kernel), kernel
    # each sleep's user stack is libc's nanosleep, named, unless the stack map had no room
    # for it (a hash bucket taken by another stack: counted lost, not overwritten)
    naps = [e for e in asleep if comm(e.prev_comm) == "sleep"]
    user = [stacks.user.get((e.prev_tgid, e.ustack - 1), []) for e in naps if e.ustack]
    named = [u[0] for u in user if u and "nanosleep" in u[0].symbol]
    assert all(f.module.endswith("libc.so.6") for f in named), user
    lost = trace.header.meta["stacks"]["lost"]
    assert named and len(named) + lost >= len(naps) >= 3, (user, trace.header.meta["stacks"])


def test_trace_record_on_6_1_loads_tp_btf_and_reports_exits(tmp_path):
    """sched_trace on Debian's 6.1: every tracepoint attaches with tp_btf (6.1's
    sched_process_exit has no group_dead argument, which a program reading one could not
    load or attach to), and the exits of a traced command say group_dead for its processes."""

    out = tmp_path / "t.xht"
    rec = subprocess.run(
        [sys.executable, "-m", "xhagent.cli", "trace", "record", "-o", str(out), "--json"]
        + ["--", "sh", "-c", "sleep 0.05; sleep 0.05"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rec.returncode == 0, rec.stderr
    from xhagent.trace.fmt import TraceFile

    trace = TraceFile(out)
    assert trace.header.meta["attach"] == "tp_btf", trace.header.meta
    assert set(trace.header.meta["events"]) >= {"switch", "wakeup", "exit", "fork"}
    perf = subprocess.run(
        [sys.executable, "-m", "xhagent.cli", "trace", "export", str(out)]
        + ["--format", "perf", "-o", "-"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert perf.returncode == 0, perf.stderr
    exits = [line for line in perf.stdout.splitlines() if "sched:sched_process_exit:" in line]
    # the two sleeps and the shell, each the last of its thread group
    assert sum("group_dead=true" in line for line in exits) >= 3, exits
    assert json.loads(rec.stdout)["lost"] == 0


def test_runqlat_loads_and_counts_waits_on_6_1(tmp_path):
    """runqlat on Debian's 6.1 (its verifier refused the histogram's index before the
    check at the access): two CPU hogs pinned to one CPU in a watched group wait for
    each other, and their waits land in its histogram, each time the programs are
    attached again while the hogs run (as the agent's restarts and doctor runs do)."""

    from xhagent.bpf.runqlat import RunqLatency
    from xhagent.cgroups import Cgroup

    group = Cgroup(f"/sys/fs/cgroup/xhagent-test-runqlat-{os.getpid()}").create()
    hog = [sys.executable, "-c", "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"]
    procs = []
    try:
        procs = [group.spawn(hog) for _ in range(2)]
        counts = []
        for _ in range(ATTACHES):
            with RunqLatency() as rq:
                rq.watch(group.path)
                time.sleep(0.5)
                hist = rq.histogram(group.path)
            counts.append(hist.count if hist else None)
        assert all(n is not None and n > 5 for n in counts), counts
    finally:
        for p in procs:
            p.kill()
            p.wait()
        group.remove(kill_first=True)
