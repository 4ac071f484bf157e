"""Pure parts of xhagent.bpf: error text, record decoding, missing pieces."""

import errno
import struct
import sys

import pytest

from xhagent.bpf import BpfError, BpfObject, decode, format_error, loader
from xhagent.bpf.sched_count import RECORD, Switch, decode_switches


def test_format_error_names_errno_and_keeps_libbpf_tail():
    log = "libbpf: prog 'on_switch': failed to attach\nlibbpf: second line\n\n"
    text = format_error("attach tp_btf/sched_switch", -errno.EPERM, log)
    assert text == (
        "attach tp_btf/sched_switch: -EPERM (Operation not permitted): "
        "libbpf: prog 'on_switch': failed to attach | second line"
    )


def test_format_error_without_log_and_kernel_names():
    assert (
        format_error("load x", errno.EOPNOTSUPP) == "load x: -EOPNOTSUPP (Operation not supported)"
    )
    # libbpf's private codes (enum libbpf_errno) get their names too
    assert format_error("open x", -4001).startswith("open x: -LIBBPF_ERRNO__FORMAT (")


def test_format_error_truncates_a_huge_verifier_log_from_the_front():
    log = (
        "\n".join(f"{i}: insn" for i in range(2000)) + "\nprocessed 4 insns: R1 invalid mem access"
    )
    text = format_error("load x", -errno.EACCES, log)
    assert len(text) < 700
    assert text.endswith("R1 invalid mem access") and "..." in text


def test_decode_switch_records():
    data = RECORD.pack(10, 1, 100, 200, 0) + RECORD.pack(11, 0, 200, 0, 0)
    assert RECORD.size == 24  # struct switch_event in ebpf/sched_count.bpf.c
    assert decode_switches(data, 2) == [Switch(10, 1, 100, 200), Switch(11, 0, 200, 0)]


def test_decode_rejects_a_byte_count_that_does_not_match():
    with pytest.raises(ValueError, match="25 bytes for 1 records of 24"):
        list(decode(b"\0" * 25, 1, struct.Struct("<QIIII")))


def test_missing_object_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "OBJECTS", tmp_path)
    with pytest.raises(BpfError) as info:
        BpfObject("sched_count")
    assert info.value.errno == errno.ENOENT
    assert "sched_count.bpf.o not found" in str(info.value)
    assert "ebpf/build.py" in str(info.value)


def test_missing_extension_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(loader, "_lib", None)
    monkeypatch.setitem(sys.modules, "xhagent._bpf", None)  # import fails
    with pytest.raises(BpfError) as info:
        loader.binding()
    assert info.value.errno == errno.ENOSYS
    assert "xhagent._bpf is not built" in str(info.value)


def test_doctor_reports_the_failed_step(monkeypatch):
    from xhagent.bpf import sched_count
    from xhagent.doctor import bpf_probe

    def refuse(**_):
        raise BpfError(
            errno.EPERM,
            format_error(
                "attach tp_btf/sched_switch", -errno.EPERM, "libbpf: prog 'on_switch': failed"
            ),
        )

    monkeypatch.setattr(sched_count, "SchedCount", refuse)
    items = bpf_probe._sched_switch()
    assert [i.name for i in items] == ["ebpf.tp_btf_sched_switch", "ebpf.ringbuf"]
    assert not any(i.ok for i in items)
    assert items[0].reason == (
        "load and attach tp_btf/sched_switch (sched_count): attach "
        "tp_btf/sched_switch: -EPERM (Operation not permitted): libbpf: "
        "prog 'on_switch': failed"
    )
