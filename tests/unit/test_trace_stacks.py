"""Kernel stacks in a trace: naming addresses from kallsyms, the stacks section of the
trace file, and the perf export's `-g` layout."""

import io
import re
import zlib

import pytest
from trace_samples import R, S, sample_header, switch

from xhagent.trace.export import write_perf
from xhagent.trace.fmt import TraceFile, TraceFormatError, write_trace
from xhagent.trace.stacks import (
    KERNEL,
    Frame,
    KernelSymbols,
    Stacks,
    decode_section,
    encode_section,
    kernel_frames,
    stack_ids,
    trim_tracing,
)

KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81000100 t entry_SYSCALL_64_after_hwframe
ffffffff81100000 T bpf_trace_run4
ffffffff81200000 t __schedule
ffffffff81200800 T schedule
ffffffff81300000 T anon_pipe_read
ffffffff81300400 d some_data
ffffffffc0001000 t bpf_prog_8ac9_btf_switch\t[bpf]
ffffffffc0100000 t nvme_poll\t[nvme]
"""
STACK = [0xFFFFFFFFC0001801, 0xFFFFFFFF8110010D, 0xFFFFFFFF81200628, 0xFFFFFFFF81200823]
STACK += [0xFFFFFFFF813004FA, 0xFFFFFFFF81000176]


def test_addresses_are_named_from_text_symbols_with_their_module():
    syms = KernelSymbols(KALLSYMS)
    assert syms.frame(0xFFFFFFFF81200628) == Frame(0xFFFFFFFF81200628, "__schedule", 0x628, KERNEL)
    # a data symbol names no code: the text symbol before it does
    assert syms.frame(0xFFFFFFFF81300500).symbol == "anon_pipe_read"
    assert syms.frame(0xFFFFFFFFC0100010) == Frame(0xFFFFFFFFC0100010, "nvme_poll", 0x10, "[nvme]")
    assert syms.frame(0x1000).symbol == "[unknown]"  # below every symbol
    assert not syms.hidden


def test_hidden_addresses_name_nothing():
    hidden = re.sub(r"^[0-9a-f]{16}", "0" * 16, KALLSYMS, flags=re.M)
    syms = KernelSymbols(hidden)
    assert syms.hidden and syms.frame(0xFFFFFFFF81200628).symbol == "[unknown]"


def test_the_tracing_frames_above_the_scheduler_are_dropped():
    syms = KernelSymbols(KALLSYMS)
    frames = trim_tracing([syms.frame(ip) for ip in STACK])
    assert [f.symbol for f in frames] == [
        "__schedule",
        "schedule",
        "anon_pipe_read",
        "entry_SYSCALL_64_after_hwframe",
    ]
    assert frames[0].perf() == "ffffffff81200628 __schedule+0x628 ([kernel.kallsyms])"
    assert (
        Frame(0x10, "[unknown]", 0, KERNEL).perf()
        == "              10 [unknown] ([kernel.kallsyms])"
    )


def test_the_section_keeps_each_stack_and_shares_frames():
    syms = KernelSymbols(KALLSYMS)
    data = encode_section(
        kernel_frames({7, 9}, lambda sid: STACK if sid == 7 else STACK[2:4], syms)
    )
    stacks = decode_section(data)
    assert [f.symbol for f in stacks.kernel[9]] == ["__schedule", "schedule"]
    assert stacks.kernel[7][:2] == stacks.kernel[9] and not stacks.user
    assert stack_ids([0, 8, 10, 8]) == {7, 9}


@pytest.mark.parametrize(
    "data",
    [
        b"not zlib",
        zlib.compress(b"[1, 2]"),
        zlib.compress(b'{"frames": [[1]], "kernel": {}}'),
        zlib.compress(b'{"frames": [], "kernel": {"1": [0]}}'),
    ],  # fmt: skip
)
def test_a_bad_section_is_a_value_error(data):
    with pytest.raises(ValueError, match="stacks section unreadable"):
        decode_section(data)


def traced(tmp_path, section: bytes | None):
    ms = 1_000_000
    events = [
        switch(1 * ms, 0, 0, "swapper/0", R, 100, "ping"),
        switch(2 * ms, 0, 100, "ping", S, 0, "swapper/0")._replace(aux=7 + 1),
        switch(3 * ms, 0, 0, "swapper/0", R, 100, "ping"),
    ]
    header = sample_header()
    header.meta["stacks"] = {"kind": "kernel"}
    path = tmp_path / "s.xht"
    write_trace(path, header, events, section)
    return path


def test_a_trace_ends_with_its_stacks_and_the_perf_export_prints_them(tmp_path):
    syms = KernelSymbols(KALLSYMS)
    path = traced(tmp_path, encode_section(kernel_frames({7}, lambda _: STACK, syms)))
    tr = TraceFile(path)
    assert len(tr) == 3 and [f.symbol for f in tr.stacks().kernel[7]][:2] == [
        "__schedule",
        "schedule",
    ]
    out = io.StringIO()
    assert write_perf(tr, out) == 3
    blocks = out.getvalue().split("\n\n")
    assert len(blocks) == 4 and blocks[3] == ""
    head, *frames = blocks[1].split("\n")
    assert "prev_comm=ping" in head and "prev_state=S" in head
    assert frames == [
        "\tffffffff81200628 __schedule+0x628 ([kernel.kallsyms])",
        "\tffffffff81200823 schedule+0x23 ([kernel.kallsyms])",
        "\tffffffff813004fa anon_pipe_read+0x4fa ([kernel.kallsyms])",
        "\tffffffff81000176 entry_SYSCALL_64_after_hwframe+0x76 ([kernel.kallsyms])",
    ]
    assert "\t" not in blocks[0] + blocks[2]  # a switch in from idle: no stack


def test_a_trace_without_stacks_exports_as_before(tmp_path):
    tr = TraceFile(traced(tmp_path, None))
    out = io.StringIO()
    write_perf(tr, out)
    assert not tr.stacks() and "\n\n" not in out.getvalue()


def test_a_stacks_section_the_metadata_misplaces_is_refused(tmp_path):
    path = traced(
        tmp_path, encode_section(kernel_frames({7}, lambda _: STACK, KernelSymbols(KALLSYMS)))
    )
    data = bytearray(path.read_bytes())
    blob_at = data.index(b'"offset":')
    data[blob_at : blob_at + 10] = b'"offset":1'  # another offset, same length of text
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="do not locate a section"):
        TraceFile(path)


def test_a_corrupt_stacks_section_is_refused_when_read(tmp_path):
    path = traced(tmp_path, b"x" * 40)
    tr = TraceFile(path)
    with pytest.raises(TraceFormatError, match="stacks section unreadable"):
        tr.stacks()


def blocks_sample():
    """ping (100) blocks twice in read (stack 7), is preempted once (stack 8); busy (300,
    outside a pid filter on 100) only shares switches with it."""
    ms = 1_000_000
    return [
        switch(1 * ms, 0, 0, "swapper/0", R, 100, "ping"),
        switch(2 * ms, 0, 100, "ping", S, 300, "busy")._replace(aux=8),  # out 2 ms
        switch(5 * ms, 0, 300, "busy", R, 100, "ping"),  # in: 3 ms off CPU
        switch(6 * ms, 0, 100, "ping", S, 0, "swapper/0")._replace(aux=8),  # out 6 ms
        switch(7 * ms, 0, 0, "swapper/0", R, 100, "ping"),  # in: 1 ms
        switch(8 * ms, 0, 100, "ping", R | 0x100, 300, "busy")._replace(aux=9),  # preempted
        switch(8 * ms + 500_000, 0, 300, "busy", R, 100, "ping"),  # in: 0.5 ms
        switch(9 * ms, 0, 100, "ping", S, 0, "swapper/0")._replace(aux=8),  # never back in
    ]


def test_off_cpu_time_is_summed_per_task_and_stack_from_switch_out_to_in():
    from xhagent.trace.offcpu import off_cpu

    syms = KernelSymbols(KALLSYMS)
    stacks = decode_section(
        encode_section(kernel_frames({7, 8}, lambda s: STACK if s == 7 else STACK[2:4], syms))
    )
    blocks = off_cpu(blocks_sample(), stacks, filt={"kind": "pids", "pids": [100]})
    got = [(b.comm, b.pid, [f.symbol for f in b.frames], b.total_ns, b.count) for b in blocks]
    assert got == [
        ("ping", 100, [f.symbol for f in stacks.kernel[7]], 4_000_000, 2),
        ("ping", 100, ["__schedule", "schedule"], 500_000, 1),  # preempted: stack 8
    ]
    # busy's switches were recorded only with ping on the other side: not counted
    assert all(b.pid == 100 for b in blocks)
    # --min-us leaves the short block out; --pid another task's leaves nothing
    pid100 = {"kind": "pids", "pids": [100]}
    assert [
        b.total_ns for b in off_cpu(blocks_sample(), stacks, min_ns=2_000_000, filt=pid100)
    ] == [3_000_000]
    # with no filter (a system-wide trace) busy's block between its runs counts too
    assert [b.pid for b in off_cpu(blocks_sample(), stacks, min_ns=2_000_000)] == [100, 300]
    assert off_cpu(blocks_sample(), stacks, pids=[555]) == []


def test_folded_stacks_follow_the_flame_graph_format():
    from xhagent.trace.offcpu import folded_lines, off_cpu

    syms = KernelSymbols(KALLSYMS)
    stacks = decode_section(
        encode_section(kernel_frames({7, 8}, lambda s: STACK if s == 7 else STACK[2:4], syms))
    )
    lines = folded_lines(off_cpu(blocks_sample(), stacks, filt={"kind": "pids", "pids": [100]}))
    assert lines == [
        "ping;entry_SYSCALL_64_after_hwframe;anon_pipe_read;schedule;__schedule 4000",
        "ping;schedule;__schedule 500",
    ]
    # stackcollapse-perf.pl's output: frames joined by ';', no space but before the count
    for line in lines:
        frames, count = line.rsplit(" ", 1)
        assert count.isdigit() and " " not in frames and all(frames.split(";"))


def test_offcpu_renders_like_offcputime():
    from xhagent.trace.offcpu import off_cpu, render

    text = render(off_cpu(blocks_sample(), Stacks(), filt={"kind": "pids", "pids": [100]}), top=1)
    assert text.splitlines() == [
        "    [no stack]",
        "    -                ping (100)",
        "        4000 us in 2 blocks",
        "",
        "4500 us off CPU in 3 blocks, 2 stacks (1 not shown, --top)",
    ]


def test_the_chrome_export_ends_each_run_with_its_switch_out_stack(tmp_path):
    import json

    from xhagent.trace.export import write_chrome

    path = traced(
        tmp_path, encode_section(kernel_frames({7}, lambda _: STACK, KernelSymbols(KALLSYMS)))
    )
    out = io.StringIO()
    write_chrome(TraceFile(path), out)
    doc = json.loads(out.getvalue())
    frames = doc["stackFrames"]
    runs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    # ping's run of 1-2 ms ended blocked with stack 7: on its CPU track and on its own
    ended = [e for e in runs if e.get("esf")]
    assert len(ended) == 2 and {e["pid"] for e in ended} == {0, 100}
    path_up, node = [], ended[0]["esf"]
    while node is not None:
        path_up.append(frames[node]["name"])
        node = frames[node].get("parent")
    assert path_up == [f.symbol for f in TraceFile(path).stacks().kernel[7]]  # innermost first
    assert all(f["category"] == KERNEL for f in frames.values())
