"""The trace file: a header, then fixed-size records exactly as the BPF program
(ebpf/sched_trace.bpf.c, struct xh_sched_event) emits them.

Header (little endian): PREFIX, then a JSON metadata block padded with spaces to
`meta_len` bytes (room is reserved so that it can be rewritten when recording ends),
then records from byte `data_offset`. `records` and `lost` are patched in place at
the end; a file whose recorder died reads with records derived from its size and
`complete` false.
"""
from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, NamedTuple

MAGIC = b"XHTRACE\x00"
VERSION = 1
# magic, version, reserved, record_size, clock_offset_ns, records, lost, flags, meta_len
PREFIX = struct.Struct("<8sHHIqQQII")
OFF_RECORDS, OFF_LOST, OFF_FLAGS = 24, 32, 40
FLAG_COMPLETE = 1
META_ROOM = 4096

# struct xh_sched_event
RECORD = struct.Struct("<QIHHIIIIiiII16s16s")
EV_SWITCH, EV_WAKEUP, EV_WAKEUP_NEW, EV_EXIT, EV_FORK = 1, 2, 3, 4, 5
EVENT_NAMES = {EV_SWITCH: "sched_switch", EV_WAKEUP: "sched_wakeup",
               EV_WAKEUP_NEW: "sched_wakeup_new", EV_EXIT: "sched_process_exit",
               EV_FORK: "sched_process_fork"}


class Event(NamedTuple):
    ts_ns: int
    cpu: int
    type: int
    pad: int
    prev_pid: int
    prev_tgid: int
    next_pid: int
    next_tgid: int
    prev_prio: int
    next_prio: int
    prev_state: int
    aux: int
    prev_comm: bytes
    next_comm: bytes


def comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def pack_event(ev: Event) -> bytes:
    return RECORD.pack(*ev)


class TraceFormatError(ValueError):
    """A file that is not a readable trace; the message starts with the file name."""


@dataclass
class Header:
    clock_offset_ns: int          # CLOCK_REALTIME - ktime (CLOCK_MONOTONIC), ns
    meta: dict = field(default_factory=dict)
    records: int = 0
    lost: int = 0
    complete: bool = False
    record_size: int = RECORD.size
    version: int = VERSION

    def encode(self, meta_len: int | None = None) -> bytes:
        blob = json.dumps(self.meta, sort_keys=True, separators=(",", ":")).encode()
        room = meta_len if meta_len is not None else max(META_ROOM, (len(blob) + 1023) // 1024 * 1024)
        if len(blob) > room:
            raise ValueError(f"trace metadata ({len(blob)} bytes) exceeds its room ({room})")
        prefix = PREFIX.pack(MAGIC, self.version, 0, self.record_size, self.clock_offset_ns,
                             self.records, self.lost, FLAG_COMPLETE if self.complete else 0, room)
        return prefix + blob.ljust(room, b" ")


def write_header(fd: int, header: Header) -> int:
    """Write the header at offset 0 of a new file; returns where records start."""
    data = header.encode()
    os.pwrite(fd, data, 0)
    os.lseek(fd, len(data), os.SEEK_SET)
    return len(data)


def finish_header(fd: int, header: Header) -> None:
    """Rewrite the header in place (same room) with the final counts and metadata."""
    meta_len = PREFIX.unpack(os.pread(fd, PREFIX.size, 0))[-1]
    header.complete = True
    try:
        data = header.encode(meta_len)
    except ValueError:  # metadata grew past its room: keep the counts at least
        header.meta = {k: v for k, v in header.meta.items() if k != "lost_per_cpu"}
        data = header.encode(meta_len)
    os.pwrite(fd, data, 0)


def write_trace(path: str | Path, header: Header, events: list[Event]) -> None:
    """A whole trace from Python (tests, conversions); the recorder streams instead."""
    header.records, header.complete = len(events), True
    with open(path, "wb") as f:
        f.write(header.encode())
        f.write(b"".join(RECORD.pack(*e) for e in events))


class TraceFile:
    """A trace opened for reading: `header`, `len()`, iteration over Event tuples."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        try:
            with open(self.path, "rb") as f:
                self._data = f.read()
        except OSError as exc:
            raise TraceFormatError(f"{self.path}: cannot read: {exc.strerror}") from None
        self.header, self.data_offset = self._parse_header()
        body = len(self._data) - self.data_offset
        whole = body // RECORD.size
        self.truncated_bytes = body % RECORD.size  # a recorder killed mid-write
        self.count = whole if not self.header.complete else min(whole, self.header.records or whole)
        if not self.header.complete:
            self.header.records = whole

    def _fail(self, what: str):
        raise TraceFormatError(f"{self.path}: {what}")

    def _parse_header(self) -> tuple[Header, int]:
        d = self._data
        if len(d) < PREFIX.size:
            self._fail(f"not an xhagent trace (only {len(d)} bytes)")
        magic, version, _, rsize, offset, records, lost, flags, meta_len = PREFIX.unpack_from(d)
        if magic != MAGIC:
            self._fail("not an xhagent trace (bad magic at offset 0)")
        if version != VERSION:
            self._fail(f"trace version {version} is not supported (this xhagent reads {VERSION})")
        if rsize != RECORD.size:
            self._fail(f"record size {rsize} at offset 12 does not match this xhagent's {RECORD.size}")
        end = PREFIX.size + meta_len
        if len(d) < end:
            self._fail(f"header truncated: metadata needs {meta_len} bytes at offset {PREFIX.size}")
        try:
            meta = json.loads(d[PREFIX.size:end].decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            self._fail(f"metadata at offset {PREFIX.size} is not JSON: {exc}")
        return Header(offset, meta, records, lost, bool(flags & FLAG_COMPLETE), rsize, version), end

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Event]:
        end = self.data_offset + self.count * RECORD.size
        for t in RECORD.iter_unpack(memoryview(self._data)[self.data_offset:end]):
            yield Event(*t)

    def events(self) -> list[Event]:
        return list(self)

    def realtime_ns(self, ts_ns: int) -> int:
        return ts_ns + self.header.clock_offset_ns


def clock_offset_ns(samples: int = 5) -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC (= bpf_ktime_get_ns), from the tightest bracket."""
    mono, real = time.CLOCK_MONOTONIC, time.CLOCK_REALTIME
    best = None
    for _ in range(samples):
        a = time.clock_gettime_ns(mono)
        r = time.clock_gettime_ns(real)
        b = time.clock_gettime_ns(mono)
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    return best[1]
