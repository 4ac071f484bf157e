import os

import pytest
from trace_samples import sample_events, sample_header, trace_bytes

from xhagent.trace.fmt import (
    MAGIC,
    PREFIX,
    RECORD,
    Header,
    TraceFile,
    TraceFormatError,
    finish_header,
    write_header,
    write_trace,
)


def test_record_matches_bpf_struct():
    assert RECORD.size == 80  # struct xh_sched_event in ebpf/sched_trace.bpf.c
    from xhagent.bpf.sched_trace import RECORD_SIZE

    assert RECORD_SIZE == RECORD.size


def test_roundtrip(tmp_path):
    path = tmp_path / "t.xht"
    events = sample_events()
    write_trace(path, sample_header(), events)
    tr = TraceFile(path)
    assert tr.header.complete and tr.header.records == len(events)
    assert tr.header.meta["hostname"] == "h"
    assert tr.header.clock_offset_ns == 1_700_000_000_000_000_000
    assert tr.events() == events
    assert tr.realtime_ns(5) == 1_700_000_000_000_000_005


def test_streamed_file_is_finished_in_place(tmp_path):
    path = tmp_path / "s.xht"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    h = sample_header()
    start = write_header(fd, h)
    os.write(fd, b"".join(RECORD.pack(*e) for e in sample_events()))
    tr = TraceFile(path)  # as if the recorder died: counts come from the size
    assert not tr.header.complete and len(tr) == len(sample_events())
    h.records, h.lost = len(sample_events()), 7
    h.meta["lost_per_cpu"] = [3, 4]
    finish_header(fd, h)
    os.close(fd)
    tr = TraceFile(path)
    assert tr.data_offset == start
    assert tr.header.complete and tr.header.lost == 7 and tr.header.meta["lost_per_cpu"] == [3, 4]


def test_partial_record_of_an_unfinished_recording_is_ignored_with_a_warning(tmp_path):
    path = tmp_path / "t.xht"
    path.write_bytes(trace_bytes(complete=False) + b"\1" * 30)
    tr = TraceFile(path)
    assert len(tr) == len(sample_events()) and tr.truncated_bytes == 30
    assert tr.warnings == [
        f"recording did not finish (the recorder stopped before writing its final "
        f"counts); {len(tr)} whole records read, 30 bytes of a partial record ignored"
    ]


def test_bytes_past_the_declared_records_are_refused(tmp_path):
    path = tmp_path / "t.xht"
    data = trace_bytes()
    path.write_bytes(data + b"\1" * 30)
    with pytest.raises(
        TraceFormatError,
        match=rf"30 bytes after the 13 records the header declares "
        rf"\(from offset {len(data):,}\)",
    ):
        TraceFile(path)


def test_a_cut_trace_is_refused_and_says_how_much_is_there(tmp_path):
    path = tmp_path / "t.xht"
    events = sample_events() + sample_events()[:5]  # 18 records
    data = trace_bytes(events=events)
    path.write_bytes(data[: -RECORD.size])
    with pytest.raises(TraceFormatError) as exc:
        TraceFile(path)
    assert str(exc.value) == (
        f"{path}: truncated: 17 of 18 declared records (1,360 of 1,440 bytes "
        "after the header); --allow-truncated reads what is there"
    )
    tr = TraceFile(path, allow_truncated=True)
    assert len(tr) == 17 and tr.events() == events[:17]
    assert tr.warnings == [
        "truncated: 17 of 18 declared records (1,360 of 1,440 bytes after the header); "
        "reading the 17 whole records"
    ]


def test_a_trace_cut_just_past_its_header_is_not_read_as_empty(tmp_path):
    path = tmp_path / "t.xht"
    path.write_bytes(trace_bytes()[:4200])
    with pytest.raises(
        TraceFormatError, match=r"truncated: 0 of 13 declared records \(56 of 1,040 bytes"
    ):
        TraceFile(path)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "only 0 bytes"),
        (b"NOTATRACE" + b"\0" * 60, "bad magic"),
        (bytes(range(256)) * 40, "bad magic"),
        (
            trace_bytes()[:1000],
            "header truncated: metadata needs 4096 bytes at offset 48, the file has 952",
        ),
        (trace_bytes(Header(0, [1, 2])), "metadata at offset 48 is an array, not an object"),
        (trace_bytes(Header(0, "x")), "metadata at offset 48 is a string, not an object"),
        (
            trace_bytes(Header(0, {"ncpus": 1.5})),
            "metadata at offset 48: ncpus is a number, not an integer",
        ),
        (
            trace_bytes(Header(0, {"ncpus": True})),
            "metadata at offset 48: ncpus is a boolean, not an integer",
        ),
        (
            trace_bytes(Header(0, {"ncpus": 1_000_000_000})),
            r"metadata at offset 48: ncpus 1000000000 is out of range \(1..8192\)",
        ),
        (
            trace_bytes(Header(0, {"filter": "all"})),
            "metadata at offset 48: filter is a string, not an object",
        ),
        (
            trace_bytes(Header(0, {"filter": {"kind": "x"}})),
            "filter.kind must be one of all, cgroup, pids",
        ),
        (trace_bytes(Header(0, {"filter": {"kind": "pids", "pids": ["1"]}})), "filter.pids"),
        (
            PREFIX.pack(MAGIC, 1, 0, 80, 0, 0, 0, 1, 8) + b'{"a":1 x',
            "metadata at offset 55 is not JSON",
        ),
        (
            PREFIX.pack(MAGIC, 1, 0, 80, 0, 0, 0, 1, 3) + b'{"\xff',
            "metadata at offset 50 is not UTF-8",
        ),
        (PREFIX.pack(MAGIC, 1, 0, 80, 0, 0, 0, 1, 100_000) + b"[" * 100_000, "nested too deeply"),
        (
            PREFIX.pack(MAGIC, 1, 0, 80, 0, 0, 0, 1, 2**32 - 1),
            "metadata length 4,294,967,295 at offset 44 is over",
        ),
        (
            trace_bytes(events=sample_events()[:3] + [sample_events()[3]._replace(type=99)]),
            "record 3 at offset 4,384: unknown type 99",
        ),
        (
            trace_bytes(events=[sample_events()[0]._replace(cpu=9000)]),
            r"record 0 at offset 4,144: CPU id 9000 is out of range \(0..8191\)",
        ),
    ],
)
def test_bad_files(tmp_path, data, message):
    path = tmp_path / "bad"
    path.write_bytes(data)
    with pytest.raises(TraceFormatError, match=message) as exc:
        TraceFile(path)
    assert str(exc.value).startswith(str(path))


def test_wrong_record_size(tmp_path):
    path = tmp_path / "t.xht"
    h = Header(0, {}, record_size=64)
    path.write_bytes(h.encode())
    with pytest.raises(TraceFormatError, match="record size 64"):
        TraceFile(path)


@pytest.mark.parametrize(
    "path, message",
    [
        ("/dev/zero", "is a character device, not a regular file"),
        ("/tmp", "is a directory, not a regular file"),
    ],
)
def test_only_regular_files_are_read(path, message):
    with pytest.raises(TraceFormatError) as exc:
        TraceFile(path)
    assert str(exc.value) == f"{path}: {message}"


def test_a_fifo_is_read_to_a_bound(tmp_path, monkeypatch):
    import threading

    from xhagent.trace import fmt

    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    data = trace_bytes()

    def feed(payload):
        def write():
            try:
                with open(fifo, "wb") as f:
                    f.write(payload)
            except BrokenPipeError:
                pass  # the reader stopped at its bound

        t = threading.Thread(target=write)
        t.start()
        return t

    t = feed(data)
    assert TraceFile(fifo).events() == sample_events()
    t.join()
    monkeypatch.setattr(fmt, "MAX_STREAMED", len(data) - 1)
    t = feed(data)
    with pytest.raises(
        TraceFormatError,
        match=f"p: is larger than {len(data) - 1:,} bytes, the limit for a trace read from a pipe",
    ):
        TraceFile(fifo)
    t.join()


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="cannot read"):
        TraceFile(tmp_path / "nope")
