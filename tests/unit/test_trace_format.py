import os

import pytest

from xhagent.trace.fmt import (RECORD, Header, TraceFile, TraceFormatError, finish_header,
                               write_header, write_trace)

from trace_samples import sample_events, sample_header


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


def test_truncated_record_is_ignored(tmp_path):
    path = tmp_path / "t.xht"
    write_trace(path, sample_header(), sample_events())
    with open(path, "ab") as f:
        f.write(b"\1" * 30)
    tr = TraceFile(path)
    assert len(tr) == len(sample_events()) and tr.truncated_bytes == 30


@pytest.mark.parametrize("data, message", [
    (b"", "only 0 bytes"),
    (b"NOTATRACE" + b"\0" * 60, "bad magic"),
])
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


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="cannot read"):
        TraceFile(tmp_path / "nope")
