"""Taskstats replies decoded from bytes laid out as the kernel lays them out (versions 16,
15 and older, shorter ones), netlink errors and stale replies, and the sysctl helpers on a
plain file. The real kernel: tests/host/test_taskstats_host.py."""

import errno
import struct

import pytest

from xhagent.metrics.taskstats import (
    NLMSG_ERROR,
    OFFSETS,
    OFFSETS_V15,
    TASKSTATS_TYPE_AGGR_PID,
    TASKSTATS_TYPE_AGGR_TGID,
    TASKSTATS_TYPE_PID,
    TASKSTATS_TYPE_STATS,
    TASKSTATS_TYPE_TGID,
    Delay,
    DelayAcct,
    TaskStatsError,
    delayacct,
    enable_delayacct,
    parse_reply,
    parse_stats,
    request,
    set_delayacct,
)

FIELDS = {
    "cpu_count": 7,
    "cpu_delay_total": 1_500_000_000,
    "blkio_count": 3,
    "blkio_delay_total": 250_000_000,
    "swapin_count": 2,
    "swapin_delay_total": 40_000_000,
    "cpu_run_real_total": 2_000_000_000,
    "cpu_run_virtual_total": 2_000_000_001,
    "freepages_count": 5,
    "freepages_delay_total": 6_000_000,
    "thrashing_count": 11,
    "thrashing_delay_total": 12_000_000,
    "compact_count": 13,
    "compact_delay_total": 14_000_000,
}


def stats(version=16, size=560, offsets=OFFSETS, fields=FIELDS) -> bytes:
    raw = bytearray(size)
    struct.pack_into("=H", raw, 0, version)
    for name, value in fields.items():
        if offsets[name] + 8 <= size:
            struct.pack_into("=Q", raw, offsets[name], value)
    return bytes(raw)


def attr(kind: int, payload: bytes) -> bytes:
    head = struct.pack("=HH", 4 + len(payload), kind)
    return head + payload + b"\0" * (-len(payload) % 4)


def reply(raw: bytes, pid=4242, seq=9, aggr=TASKSTATS_TYPE_AGGR_TGID, id_type=TASKSTATS_TYPE_TGID):
    body = struct.pack("=BBH", 2, 1, 0) + attr(
        aggr, attr(id_type, struct.pack("=I", pid)) + attr(TASKSTATS_TYPE_STATS, raw)
    )
    return struct.pack("=IHHII", 16 + len(body), 31, 0, seq, 0) + body


def test_the_request_is_a_taskstats_get_of_one_u32_attribute():
    msg = request(31, 7, 1234)
    assert len(msg) == 28
    assert struct.unpack("=IHHII", msg[:16]) == (28, 31, 1, 7, 0)  # NLM_F_REQUEST, no ack
    assert struct.unpack("=BBH", msg[16:20]) == (1, 1, 0)  # TASKSTATS_CMD_GET, version 1
    assert struct.unpack("=HHI", msg[20:]) == (8, 2, 1234)  # TASKSTATS_CMD_ATTR_TGID
    assert struct.unpack("=HHI", request(31, 7, 99, thread=True)[20:]) == (8, 1, 99)


def test_a_version_16_reply_gives_each_delay_in_seconds_with_its_count():
    d = parse_reply(reply(stats()), seq=9)
    assert (d.pid, d.version) == (4242, 16)
    assert d.cpu == Delay(7, 1.5)
    assert d.blkio == Delay(3, 0.25)
    assert d.swapin == Delay(2, 0.04)
    assert d.reclaim == Delay(5, 0.006)
    assert d.thrashing == Delay(11, 0.012)
    assert d.compact == Delay(13, 0.014)
    assert (d.run, d.run_real) == (2.000000001, 2.0)


def test_version_15_is_read_at_its_own_offsets():
    # The same values at version 16's offsets would read as other fields (or zeros).
    raw = stats(version=15, size=560, offsets=OFFSETS_V15)
    d = parse_stats(raw, 1)
    assert (d.cpu, d.blkio, d.swapin, d.reclaim) == (
        Delay(7, 1.5),
        Delay(3, 0.25),
        Delay(2, 0.04),
        Delay(5, 0.006),
    )
    assert (d.thrashing, d.compact, d.run_real) == (Delay(11, 0.012), Delay(13, 0.014), 2.0)
    assert parse_stats(stats(version=16, offsets=OFFSETS_V15), 1).blkio != Delay(3, 0.25)


def test_an_older_kernels_shorter_struct_lacks_the_later_delays():
    # Version 8 ends after freepages (328 bytes): no thrashing (v9) nor compact (v11).
    d = parse_stats(stats(version=8, size=328), 1)
    assert d.reclaim == Delay(5, 0.006) and d.thrashing is None and d.compact is None
    # Version 10 has thrashing, not compact.
    d = parse_stats(stats(version=10, size=352), 1)
    assert d.thrashing == Delay(11, 0.012) and d.compact is None
    # Version 1 had no reclaim delay at all: counted as none rather than refused.
    d = parse_stats(stats(version=1, size=80), 1)
    assert d.cpu == Delay(7, 1.5) and d.reclaim == Delay(0, 0.0)
    with pytest.raises(ValueError, match="shorter than version 1"):
        parse_stats(b"\x10\0" * 30)


def test_a_thread_reply_and_a_nested_flag_are_read_too():
    d = parse_reply(
        reply(stats(), pid=77, aggr=TASKSTATS_TYPE_AGGR_PID, id_type=TASKSTATS_TYPE_PID)
    )
    assert d.pid == 77 and d.cpu == Delay(7, 1.5)
    nested = bytearray(reply(stats()))
    at = 20 + 2  # the type of the first attribute after nlmsghdr and genlmsghdr
    struct.pack_into("=H", nested, at, TASKSTATS_TYPE_AGGR_TGID | 0x8000)  # NLA_F_NESTED
    assert parse_reply(bytes(nested)).blkio == Delay(3, 0.25)


def test_errors_and_stale_replies():
    err = struct.pack("=IHHII", 36, NLMSG_ERROR, 0, 9, 0) + struct.pack("=i", -errno.ESRCH)
    assert parse_reply(err + b"\0" * 16, seq=9) == -errno.ESRCH
    # An answer to an earlier request (a later sequence number was sent since) is skipped.
    assert parse_reply(reply(stats(), seq=8), seq=9) is None
    body = struct.pack("=BBH", 2, 1, 0) + attr(
        TASKSTATS_TYPE_AGGR_TGID, attr(TASKSTATS_TYPE_TGID, struct.pack("=I", 1))
    )
    with pytest.raises(ValueError, match="without TASKSTATS_TYPE_STATS"):
        parse_reply(struct.pack("=IHHII", 16 + len(body), 31, 0, 9, 0) + body)
    with pytest.raises(ValueError, match="says 596 bytes, 100 came"):
        parse_reply(reply(stats())[:100])
    truncated = bytearray(reply(stats()))
    struct.pack_into("=H", truncated, 20, 2000)  # an attribute longer than the message
    with pytest.raises(ValueError, match="overruns"):
        parse_reply(bytes(truncated))


def test_sysctl_helpers_on_a_plain_file(tmp_path):
    path = tmp_path / "task_delayacct"
    absent = delayacct(path)
    assert absent.state == "absent" and "CONFIG_TASK_DELAY_ACCT" in absent.reason
    assert enable_delayacct(path) == absent  # nothing written, nothing raised
    assert not path.exists()
    with pytest.raises(TaskStatsError, match="CONFIG_TASK_DELAY_ACCT") as err:
        set_delayacct(True, path)
    assert err.value.errno == errno.ENOENT

    path.write_text("0\n")
    assert delayacct(path) == DelayAcct("off")
    assert enable_delayacct(path) == DelayAcct("on", changed=True)
    assert path.read_text() == "1\n"
    assert enable_delayacct(path) == DelayAcct("on", changed=False)  # already on: untouched


def test_the_family_lookup_is_a_plain_generic_netlink_request_and_reply():
    import struct

    from xhagent.metrics import taskstats as ts

    req = ts.family_request("TASKSTATS", seq=7)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", req)
    assert (length, kind, flags, seq) == (len(req), 0x10, 1, 7) and length % 4 == 0
    assert struct.unpack_from("=BB", req, 16) == (3, 1)  # CTRL_CMD_GETFAMILY, version 1
    assert req[20:24] == struct.pack("=HH", 4 + 10, 2) and req[24:34] == b"TASKSTATS\0"
    # a reply: the family name, then its id
    name = struct.pack("=HH", 14, 2) + b"TASKSTATS\0" + b"\0\0"
    fid = struct.pack("=HHH", 6, 1, 0x1C) + b"\0\0"
    body = struct.pack("=BBH", 1, 2, 0) + name + fid
    reply = struct.pack("=IHHII", 16 + len(body), 0x10, 0, 7, 0) + body
    assert ts.parse_family_reply(reply) == 0x1C
    err = struct.pack("=IHHII", 36, 2, 0, 7, 0) + struct.pack("=i", -2) + b"\0" * 16
    assert ts.parse_family_reply(err) == -2
