"""sched_count.bpf.o: context switches counted per CPU (tp_btf/sched_switch), and the
switches of one target process streamed through a ring buffer."""

from __future__ import annotations

import os
import select
import threading
from dataclasses import dataclass

from .layout import Mirror, Record, pick
from .loader import BpfObject, ProgramLoader, decode

# ebpf/sched_count.h; checked against the object's BTF by tests/unit/test_bpf_layout.py.
RECORD = Record(
    "switch_event",
    (("ts_ns", "Q"), ("cpu", "I"), ("prev_pid", "I"), ("next_pid", "I"), ("pad", "I")),
)
COUNT_SWITCHES, COUNT_DROPPED = 0, 1
MIRROR = Mirror(
    "sched_count",
    records=(RECORD,),
    enums={"xh_switch_count": pick(globals(), "COUNT_SWITCHES COUNT_DROPPED")},
)


@dataclass(frozen=True)
class Switch:
    ts_ns: int
    cpu: int
    prev_pid: int
    next_pid: int


def decode_switches(data: bytes, count: int) -> list[Switch]:
    return [Switch(ts, cpu, prev, nxt) for ts, cpu, prev, nxt, _ in decode(data, count, RECORD)]


class SchedCount(ProgramLoader):
    """Loaded and attached on construction; use as a context manager to detach."""

    def __init__(self, target_tgid: int = 0):
        self.obj = BpfObject("sched_count")
        try:
            self.obj.map("target").set_u32(0, target_tgid)
            self._counts = self.obj.map("counts")
            self._ring = self.obj.ring_buffer("events")
            self.obj.program("on_switch").attach()
        except BaseException:
            self.obj.close()
            raise

    def set_target(self, tgid: int) -> None:
        """Stream the switches where prev or next belongs to `tgid` (0 = none)."""
        self.obj.map("target").set_u32(0, tgid)

    def switches(self) -> int:
        return self._counts.sum_percpu(COUNT_SWITCHES)

    def dropped(self) -> int:
        """Records lost because the ring buffer was full."""
        return self._counts.sum_percpu(COUNT_DROPPED)

    def drain(self, timeout_ms: int = 0) -> list[Switch]:
        return decode_switches(*self._ring.drain(timeout_ms))


def ping_pong(rounds: int = 200) -> tuple[int, int]:
    """Bounce a byte between this thread and a helper thread through two pipes, so
    that each side blocks and is switched out `rounds` times. Returns both tids."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    peer: list[int] = []

    def echo():
        peer.append(threading.get_native_id())
        for _ in range(rounds):
            os.write(b_w, os.read(a_r, 1))

    t = threading.Thread(target=echo, name="xh-bpf-pingpong", daemon=True)
    t.start()
    try:
        for _ in range(rounds):
            os.write(a_w, b"x")
            # bounded, so that a dead peer cannot hang the doctor
            if not select.select([b_r], [], [], 5)[0]:
                raise TimeoutError("ping-pong peer thread stopped answering")
            os.read(b_r, 1)
        t.join(5)
    finally:
        for fd in (a_r, a_w, b_r, b_w):
            os.close(fd)
    return threading.get_native_id(), peer[0]
