"""Inside the guest VM (Debian's 6.1 kernel): the BPF objects built against the host's
6.18 BTF load through CO-RE relocation, and tp_btf/sched_switch delivers events."""

import os
import platform

import pytest

from xhagent.bpf.sched_count import SchedCount, ping_pong
from xhagent.doctor.bpf_probe import probe

pytestmark = pytest.mark.kernel


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
    items = {i.name: i for i in probe()}
    bad = {n: i.reason for n, i in items.items() if not i.ok}
    assert not bad, f"{platform.release()}: {bad}"
