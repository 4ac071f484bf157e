"""The trace file: a header, then fixed-size records exactly as the BPF program
(ebpf/sched_trace.bpf.c, struct xh_sched_event of ebpf/sched_trace.h) emits them.

Header (little endian): PREFIX, then a JSON metadata block padded with spaces to
`meta_len` bytes (room is reserved so that it can be rewritten when recording ends),
then records from byte `data_offset`. `records` and `lost` are patched in place at
the end; a file whose recorder died reads with records derived from its size and
`complete` false. A recording with stacks ends with its stacks section (stacks.py), right
after the records, where metadata `stacks.offset` and `stacks.bytes` say.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..bpf.layout import Mirror, Record, pick
from ..cpulist import MAX_CPUS
from ..inputs import InputError, open_input, read_input
from .stacks import MAX_SECTION, Stacks, decode_section

MAGIC = b"XHTRACE\x00"
VERSION = 1
# magic, version, reserved, record_size, clock_offset_ns, records, lost, flags, meta_len
PREFIX = struct.Struct("<8sHHIqQQII")
OFF_RECORDS, OFF_LOST, OFF_FLAGS = 24, 32, 40
FLAG_COMPLETE = 1
META_ROOM = 4096

# struct xh_sched_event and enum xh_event_type of ebpf/sched_trace.h, checked against
# sched_trace.bpf.o's BTF by tests/unit/test_bpf_layout.py (MIRROR).
RECORD = Record(
    "xh_sched_event",
    (
        ("ts_ns", "Q"),
        ("cpu", "I"),
        ("type", "H"),
        ("ustack", "H"),
        ("prev_pid", "I"),
        ("prev_tgid", "I"),
        ("next_pid", "I"),
        ("next_tgid", "I"),
        ("prev_prio", "i"),
        ("next_prio", "i"),
        ("prev_state", "I"),
        ("aux", "I"),
        ("prev_comm", "16s"),
        ("next_comm", "16s"),
    ),
)
OFF_CPU, OFF_TYPE = 8, 12  # of a record's cpu (u32) and type (u16)
EV_SWITCH, EV_WAKEUP, EV_WAKEUP_NEW, EV_EXIT, EV_FORK, EV_WAKING = 1, 2, 3, 4, 5, 6
MIRROR = Mirror(
    "sched_trace",
    records=(RECORD,),
    enums={
        "xh_event_type": pick(
            globals(), "EV_SWITCH EV_WAKEUP EV_WAKEUP_NEW EV_EXIT EV_FORK EV_WAKING"
        )
    },
)
EVENT_NAMES = {
    EV_SWITCH: "sched_switch",
    EV_WAKEUP: "sched_wakeup",
    EV_WAKEUP_NEW: "sched_wakeup_new",
    EV_EXIT: "sched_process_exit",
    EV_FORK: "sched_process_fork",
    EV_WAKING: "sched_waking",
}


class Event(NamedTuple):
    ts_ns: int
    cpu: int
    type: int
    ustack: int  # a switch's user stack id + 1 (0: none)
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
    clock_offset_ns: int  # CLOCK_REALTIME - ktime (CLOCK_MONOTONIC), ns
    meta: dict = field(default_factory=dict)
    records: int = 0
    lost: int = 0
    complete: bool = False
    record_size: int = RECORD.size
    version: int = VERSION

    def encode(self, meta_len: int | None = None) -> bytes:
        blob = json.dumps(self.meta, sort_keys=True, separators=(",", ":")).encode()
        room = (
            meta_len if meta_len is not None else max(META_ROOM, (len(blob) + 1023) // 1024 * 1024)
        )
        if len(blob) > room:
            raise ValueError(f"trace metadata ({len(blob)} bytes) exceeds its room ({room})")
        prefix = PREFIX.pack(
            MAGIC,
            self.version,
            0,
            self.record_size,
            self.clock_offset_ns,
            self.records,
            self.lost,
            FLAG_COMPLETE if self.complete else 0,
            room,
        )
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


def write_trace(
    path: str | Path, header: Header, events: list[Event], stacks: bytes | None = None
) -> None:
    """A whole trace from Python (tests, conversions); the recorder streams instead.
    `stacks`: a stacks section's bytes (stacks.encode_section) to end it with."""
    header.records, header.complete = len(events), True
    if stacks is not None:
        room = len(header.encode())
        header.meta["stacks"] = {
            **header.meta.get("stacks", {}),
            "offset": room + len(events) * RECORD.size,
            "bytes": len(stacks),
        }
    with open(path, "wb") as f:
        f.write(header.encode())
        f.write(b"".join(RECORD.pack(*e) for e in events))
        f.write(stacks or b"")


def append_stacks(fd: int, header: Header, data_offset: int, section: bytes) -> None:
    """The stacks section after the header.records records (the recorder's, at the end;
    finish_header writes the metadata that locates it)."""
    offset = data_offset + header.records * RECORD.size
    os.pwrite(fd, section, offset)
    header.meta["stacks"] = {**header.meta.get("stacks", {}), "offset": offset}
    header.meta["stacks"]["bytes"] = len(section)


MAX_META = 1 << 20  # metadata is a few hundred bytes; room is reserved in KiB
MAX_STREAMED = 256 << 20  # a trace read from a pipe is held in memory: 3.3 million records
# Types of the metadata the readers use; other keys are kept as they are (JSON values).
META_TYPES = {
    "ncpus": int,
    "filter": dict,
    "events": list,
    "hostname": str,
    "kernel": str,
    "attach": str,
    "record": str,
    "started_realtime_ns": int,
    "elapsed_ns": int,
    "lost_per_cpu": list,
    "foreign_records": int,
    "stacks": dict,
}
FILTER_KINDS = ("all", "cgroup", "pids")


class TraceFile:
    """A trace opened for reading: `header`, `len()`, iteration over Event tuples.

    A regular file is mapped, not read, so that memory does not grow with its size before
    the records are used; a FIFO or `-` is read, up to MAX_STREAMED bytes. Everything a
    reader relies on is checked here, so that a bad file is one TraceFormatError naming the
    file (and the offset or record), never a traceback: the header, the metadata's types,
    every record's type and CPU, and the record count.
    A complete file with fewer records than it declares was cut: refused unless
    `allow_truncated`. A file whose recorder died (complete flag 0) has no count to check
    against; it is read with a warning in `warnings`."""

    def __init__(self, path: str | Path, allow_truncated: bool = False):
        self.path = str(path)
        self.warnings: list[str] = []
        self._data = self._map()
        self.header, self.data_offset = self._parse_header()
        self._stacks: Stacks | None = None
        self.count, self.truncated_bytes = self._count_records(allow_truncated)
        self._check_records()

    def _fail(self, what: str):
        raise TraceFormatError(f"{self.path}: {what}")

    def _map(self):
        """The file's bytes: a regular file mapped, a FIFO or `-` read to MAX_STREAMED."""
        try:
            streamed = self.path == "-" or stat.S_ISFIFO(os.stat(self.path).st_mode)
        except OSError:
            streamed = False  # open_input says why
        try:
            if streamed:  # a pipe cannot be mapped
                data = read_input(self.path, MAX_STREAMED, "a trace read from a pipe")
            else:
                data = _map_regular(self.path)
        except InputError as exc:
            raise TraceFormatError(str(exc)) from None
        if len(data) < PREFIX.size:
            self._fail(f"not an xhagent trace (only {len(data)} bytes)")
        return data

    def _parse_header(self) -> tuple[Header, int]:
        d = self._data
        magic, version, _, rsize, offset, records, lost, flags, meta_len = PREFIX.unpack_from(d)
        if magic != MAGIC:
            self._fail("not an xhagent trace (bad magic at offset 0)")
        if version != VERSION:
            self._fail(f"trace version {version} is not supported (this xhagent reads {VERSION})")
        if rsize != RECORD.size:
            self._fail(
                f"record size {rsize} at offset 12 does not match this xhagent's {RECORD.size}"
            )
        if meta_len > MAX_META:
            self._fail(
                f"metadata length {meta_len:,} at offset 44 is over the limit ({MAX_META:,} bytes)"
            )
        end = PREFIX.size + meta_len
        if len(d) < end:
            self._fail(
                f"header truncated: metadata needs {meta_len} bytes at offset {PREFIX.size}, "
                f"the file has {len(d) - PREFIX.size}"
            )
        try:
            meta = json.loads(d[PREFIX.size : end].decode())
        except UnicodeDecodeError as exc:
            self._fail(f"metadata at offset {PREFIX.size + exc.start} is not UTF-8")
        except json.JSONDecodeError as exc:
            self._fail(f"metadata at offset {PREFIX.size + exc.pos} is not JSON: {exc.msg}")
        except RecursionError:
            self._fail(f"metadata at offset {PREFIX.size} is nested too deeply")
        self._check_meta(meta)
        return Header(offset, meta, records, lost, bool(flags & FLAG_COMPLETE), rsize, version), end

    def _check_meta(self, meta) -> None:
        where = f"metadata at offset {PREFIX.size}"
        if not isinstance(meta, dict):
            self._fail(f"{where} is {_json_type(meta)}, not an object")
        for key, want in META_TYPES.items():
            v = meta.get(key)
            if v is not None and (not isinstance(v, want) or isinstance(v, bool)):
                self._fail(f"{where}: {key} is {_json_type(v)}, not {_json_type(want())}")
        ncpus = meta.get("ncpus")
        if ncpus is not None and not 1 <= ncpus <= MAX_CPUS:
            self._fail(f"{where}: ncpus {ncpus} is out of range (1..{MAX_CPUS})")
        filt = meta.get("filter")
        if filt is not None:
            if filt.get("kind") not in FILTER_KINDS:
                self._fail(f"{where}: filter.kind must be one of {', '.join(FILTER_KINDS)}")
            pids = filt.get("pids", [])
            if (
                not isinstance(pids, list)
                or not all(_is_int(p) for p in pids)
                or not _is_int(filt.get("command_pid", 0))
            ):
                self._fail(f"{where}: filter.pids and filter.command_pid must be integers")

    def _stacks_section(self) -> tuple[int, int] | None:
        """(offset, bytes) of the stacks section a complete trace says it ends with."""
        s = self.header.meta.get("stacks") or {}
        if not self.header.complete or "offset" not in s:
            return None
        offset, size = s.get("offset"), s.get("bytes")
        want = self.data_offset + self.header.records * RECORD.size
        if not (_is_int(offset) and _is_int(size)) or offset != want or not 0 < size <= MAX_SECTION:
            self._fail(
                f"metadata at offset {PREFIX.size}: stacks.offset/bytes ({offset}, {size}) do not "
                f"locate a section after the {self.header.records} records (offset {want})"
            )
        if offset + size > len(self._data):  # cut: the records' own check says how far
            return None
        return offset, size

    def stacks(self) -> Stacks:
        """The trace's stacks (empty for a trace without: false)."""
        if self._stacks is None:
            where = self._stacks_section()
            self._stacks = Stacks()
            if where is not None:
                offset, size = where
                try:
                    self._stacks = decode_section(bytes(self._data[offset : offset + size]))
                except ValueError as exc:
                    self._fail(f"offset {offset:,}: {exc}")
        return self._stacks

    def _count_records(self, allow_truncated: bool) -> tuple[int, int]:
        h, body = self.header, len(self._data) - self.data_offset
        section = self._stacks_section()
        if section is not None:
            body -= section[1]
        whole, partial = divmod(body, RECORD.size)
        if not h.complete:
            h.records = whole
            self.warnings.append(
                f"recording did not finish (the recorder stopped before writing its final counts); "
                f"{whole} whole records read"
                + (f", {partial} bytes of a partial record ignored" if partial else "")
            )
            return whole, partial
        declared = h.records * RECORD.size
        if body > declared:
            self._fail(
                f"{body - declared:,} bytes after the {h.records} records the header declares "
                f"(from offset {self.data_offset + declared:,})"
            )
        if body < declared:
            what = (
                f"truncated: {whole} of {h.records} declared records "
                f"({body:,} of {declared:,} bytes after the header)"
            )
            if not allow_truncated:
                self._fail(f"{what}; --allow-truncated reads what is there")
            self.warnings.append(f"{what}; reading the {whole} whole records")
        return whole, partial

    def _check_records(self) -> None:
        """Every record's type is known and its CPU id in range (whole columns at C speed)."""
        start = self.data_offset
        view = memoryview(self._data)[start : start + self.count * RECORD.size]
        columns = (
            ("type", view.cast("H")[OFF_TYPE // 2 :: RECORD.size // 2], EVENT_NAMES.__contains__),
            ("cpu", view.cast("I")[OFF_CPU // 4 :: RECORD.size // 4], range(MAX_CPUS).__contains__),
        )
        for name, column, valid in columns:
            if not all(map(valid, set(column))):
                i = next(i for i, v in enumerate(column) if not valid(v))
                problem = (
                    f"unknown type {column[i]}"
                    if name == "type"
                    else f"CPU id {column[i]} is out of range (0..{MAX_CPUS - 1})"
                )
                self._fail(f"record {i} at offset {start + i * RECORD.size:,}: {problem}")

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Event]:
        end = self.data_offset + self.count * RECORD.size
        for t in RECORD.iter_unpack(memoryview(self._data)[self.data_offset : end]):
            yield Event(*t)

    def events(self) -> list[Event]:
        return list(self)

    def realtime_ns(self, ts_ns: int) -> int:
        return ts_ns + self.header.clock_offset_ns


def _map_regular(path: str):
    fd = open_input(path)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _json_type(v) -> str:
    """How a JSON value's type reads in a message (not Python's type names)."""
    if isinstance(v, bool):
        return "a boolean"
    for t, name in (
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (list, "an array"),
        (dict, "an object"),
    ):
        if isinstance(v, t):
            return name
    return "null"


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
