"""The Python layouts of what user space reads from a BPF program agree with the
compiled object's BTF: every field name, offset, size and signedness of the record
and map value structs, and every enum value (ebpf/<program>.h, XH_BTF_EXPORT).
A drifted layout, on either side, is reported field by field."""

import dataclasses
import runpy
import shutil
from pathlib import Path

import pytest

from xhagent.bpf import (
    BpfObject,
    loader,
    preempt,
    runqlat,
    sched_count,
    sched_trace,
    signal_probe,
)
from xhagent.bpf.layout import Mirror, Record, mismatches, read_btf
from xhagent.trace import fmt

ROOT = Path(__file__).resolve().parents[2]
# Every module that mirrors a part of a program's header.
MIRRORS = [
    fmt.MIRROR,
    sched_trace.MIRROR,
    sched_count.MIRROR,
    preempt.MIRROR,
    signal_probe.MIRROR,
    runqlat.MIRROR,
]


def _object(name: str) -> Path:
    path = loader.OBJECTS / f"{name}.bpf.o"
    assert path.exists(), f"{path} is not built: pip install -e . (ebpf/build.py) builds it"
    return path


def _programs() -> list[str]:
    return sorted(p.name[: -len(".bpf.c")] for p in (ROOT / "ebpf").glob("*.bpf.c"))


@pytest.mark.parametrize(
    "mirror", MIRRORS, ids=lambda m: f"{m.obj}:{','.join(m.enums) or m.records[0].c_name}"
)
def test_python_layout_matches_the_objects_btf(mirror):
    assert mismatches(read_btf(_object(mirror.obj)), mirror) == []


@pytest.mark.parametrize("program", _programs())
def test_every_exported_type_has_a_python_mirror(program):
    """What a header exports (XH_BTF_EXPORT) is what user space reads: each such
    struct and enum is mirrored, and a program without exports is a mistake."""
    btf = read_btf(_object(program))
    assert btf.exported, f"ebpf/{program}.bpf.c exports no type with XH_BTF_EXPORT"
    mirrored = set()
    for m in MIRRORS:
        if m.obj == program:
            mirrored |= {("struct", r.c_name) for r in m.records} | {("enum", e) for e in m.enums}
    assert set(btf.exported) == mirrored


def test_btf_reader_sees_the_record_as_c_lays_it_out():
    size, members = read_btf(_object("sched_trace")).structs["xh_sched_event"]
    assert size == 80
    by_name = {m.name: m for m in members}
    assert (by_name["type"].offset, by_name["type"].size, by_name["type"].kind) == (
        12,
        2,
        "unsigned",
    )
    assert (by_name["prev_prio"].offset, by_name["prev_prio"].kind) == (32, "signed")
    assert (by_name["next_comm"].offset, by_name["next_comm"].size, by_name["next_comm"].kind) == (
        64,
        16,
        "array",
    )


def test_named_layouts_are_the_tuples_user_space_builds():
    assert fmt.Event._fields == fmt.RECORD.names
    assert tuple(f.name for f in dataclasses.fields(preempt.ThreadState)) == preempt.STATE.names
    assert fmt.RECORD.format == "<QIHHIIIIiiII16s16s"  # the trace file format, unchanged
    offsets = {name: off for name, off, _, _ in fmt.RECORD.members()}
    assert (fmt.OFF_CPU, fmt.OFF_TYPE) == (
        offsets["cpu"],
        offsets["type"],
    )  # the reader's column checks


def _altered(record: Record, **codes) -> Record:
    return Record(record.c_name, tuple((n, codes.get(n, c)) for n, c in record.fields))


def test_a_drifted_python_layout_is_detected():
    btf = read_btf(_object("sched_trace"))
    rec = fmt.RECORD
    # a field widened: its size, and the offset of every later field, differ
    wide = mismatches(btf, Mirror("sched_trace", records=(_altered(rec, type="I"),)))
    assert "struct xh_sched_event: 80 bytes in C, 82 in Python" in wide
    assert any(
        m.startswith("struct xh_sched_event.type: offset 12 size 2 in C, offset 12 size 4")
        for m in wide
    )
    assert any(
        m.startswith("struct xh_sched_event.prev_pid: offset 16 size 4 in C, offset 18")
        for m in wide
    )
    # signedness
    assert mismatches(btf, Mirror("sched_trace", records=(_altered(rec, prev_prio="I"),))) == [
        "struct xh_sched_event.prev_prio: signed in C, 'I' (unsigned) in Python"
    ]
    # two fields of the same size swapped: sizes agree, names do not
    swapped = list(rec.fields)
    swapped[4], swapped[6] = swapped[6], swapped[4]
    drift = mismatches(btf, Mirror("sched_trace", records=(Record(rec.c_name, tuple(swapped)),)))
    assert any("fields" in m and "'next_pid', 'prev_tgid', 'prev_pid'" in m for m in drift)
    assert (
        "struct xh_sched_event.prev_pid: offset 16 size 4 in C, offset 24 size 4 in Python ('I')"
        in drift
    )
    # a struct the object does not have
    assert mismatches(btf, Mirror("sched_trace", records=(Record("xh_gone", (("a", "Q"),)),))) == [
        "struct xh_gone: not in sched_trace.bpf.o's BTF"
    ]


def test_a_drifted_integer_array_is_detected():
    """runq_hist.slots is an array of __u64: a different length moves what follows it,
    and the same bytes as plain integers are not the array BTF describes."""
    btf = read_btf(_object("runqlat"))
    rec = runqlat.HIST
    n = runqlat.RUNQ_SLOTS
    assert mismatches(btf, runqlat.MIRROR) == []
    short = mismatches(btf, Mirror("runqlat", records=(_altered(rec, slots=f"{n - 1}Q"),)))
    assert f"struct runq_hist: {8 * n + 8} bytes in C, {8 * n} in Python" in short
    assert any(m.startswith(f"struct runq_hist.sum_ns: offset {8 * n} size 8 in C") for m in short)
    signed = mismatches(btf, Mirror("runqlat", records=(_altered(rec, slots="Q"),)))
    assert "struct runq_hist.slots: array in C, 'Q' (unsigned) in Python" in signed


def test_a_drifted_enum_is_detected():
    btf = read_btf(_object("sched_trace"))
    values = dict(fmt.MIRROR.enums["xh_event_type"])
    values["EV_EXIT"] = 7
    del values["EV_FORK"]
    assert mismatches(btf, Mirror("sched_trace", enums={"xh_event_type": values})) == [
        "enum xh_event_type: EV_EXIT is 4 in C, 7 in Python",
        "enum xh_event_type: EV_FORK is 5 in C, missing in Python",
    ]
    # only the array-size sentinel may be left out; an extra Python name is drift too
    extra = {**sched_trace.MIRROR.enums["xh_trace_cfg"], "CFG_RATE": 3}
    assert mismatches(btf, Mirror("sched_trace", enums={"xh_trace_cfg": extra})) == [
        "enum xh_trace_cfg: CFG_RATE is missing in C, 3 in Python"
    ]


@pytest.mark.skipif(
    shutil.which("clang") is None or shutil.which("llvm-strip") is None,
    reason="needs clang and llvm-strip (the BPF build tools)",
)
def test_a_drifted_c_header_is_detected(tmp_path):
    """The other side: sched_count.h with two fields swapped and an enumerator moved,
    compiled as the build does, no longer matches the Python mirror."""
    build = runpy.run_path(str(ROOT / "ebpf" / "build.py"))
    src = tmp_path / "ebpf"
    shutil.copytree(ROOT / "ebpf", src, ignore=shutil.ignore_patterns("*.bpf.c"))
    shutil.copy(ROOT / "ebpf" / "sched_count.bpf.c", src)
    build["vmlinux_header"](src)  # generated by the build, kept beside the sources
    header = (src / "sched_count.h").read_text()
    drifted = (
        header.replace("\t__u32 prev_pid;", "\t__u32 PLACEHOLDER;")
        .replace("\t__u32 next_pid;", "\t__u32 prev_pid;")
        .replace("\t__u32 PLACEHOLDER;", "\t__u32 next_pid;")
    )
    drifted = drifted.replace("COUNT_SWITCHES, COUNT_DROPPED", "COUNT_DROPPED, COUNT_SWITCHES")
    assert drifted.count("next_pid") == header.count("next_pid") and drifted != header
    (src / "sched_count.h").write_text(drifted)
    out = tmp_path / "sched_count.bpf.o"
    build["compile_one"](src / "sched_count.bpf.c", out, src)
    drift = mismatches(read_btf(out), sched_count.MIRROR)
    assert (
        "struct switch_event.prev_pid: offset 16 size 4 in C, offset 12 size 4 in Python ('I')"
        in drift
    )
    assert "enum xh_switch_count: COUNT_SWITCHES is 1 in C, 0 in Python" in drift
    # and the same source unaltered agrees
    (src / "sched_count.h").write_text(header)
    build["compile_one"](src / "sched_count.bpf.c", out, src)
    assert mismatches(read_btf(out), sched_count.MIRROR) == []


def test_opening_an_object_logs_nothing_about_the_export_section():
    """libbpf skips XH_BTF_EXPORT's section with an info line; a failure's message
    (built from the captured log) must not carry it."""
    loader.binding()
    loader._fresh()
    obj = BpfObject("preempt", load=False)
    try:
        assert ".xh_btf" not in loader._log()
    finally:
        obj.close()
