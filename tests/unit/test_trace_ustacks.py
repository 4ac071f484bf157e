"""User stacks in a trace: the mappings read from /proc/PID/maps, addresses named from the
mapped files' real ELF symbols (this process's own libc), what stays unnamed and why, and
user frames after kernel frames in the stacks section and the perf export."""

import ctypes
import io
import mmap
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from trace_samples import R, S, sample_header, switch

import xhagent.daemon.exec
from xhagent.trace.export import write_perf
from xhagent.trace.fmt import TraceFile, write_trace
from xhagent.trace.stacks import KERNEL, UNKNOWN, Frame, Stacks, decode_section, encode_section
from xhagent.trace.ustacks import (
    MAX_PROCESSES,
    UNKNOWN_MODULE,
    ElfSymbols,
    Mapping,
    ProcessMaps,
    UserSymbols,
    _open_mapped,
    parse_maps,
)

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1311 /usr/bin/ping
55d0c0a01000-55d0c0a05000 r-xp 00001000 fe:01 1311 /usr/bin/ping
55d0c1d4c000-55d0c1d6d000 rw-p 00000000 00:00 0 [heap]
7f3a3c628000-7f3a3c77d000 r-xp 00026000 fe:01 9921 /usr/lib/x86_64-linux-gnu/libc.so.6
7f3a3c9d0000-7f3a3c9d2000 r-xp 00000000 00:00 0 [vdso]
7f3a3ca00000-7f3a3ca10000 r-xp 00000000 00:05 77 /memfd:jit (deleted)
not a line at all
"""


def test_only_executable_file_mappings_are_kept():  # as perf names their modules
    maps = parse_maps(MAPS)
    assert [(m.path, m.start, m.offset, m.dev, m.inode) for m in maps] == [
        ("/usr/bin/ping", 0x55D0C0A01000, 0x1000, (0xFE, 1), 1311),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", 0x7F3A3C628000, 0x26000, (0xFE, 1), 9921),
        # a file gone since (it names nothing: no file of that device and inode to read)
        ("/memfd:jit (deleted)", 0x7F3A3CA00000, 0, (0, 5), 77),
    ]


def own_function(name: str) -> int:
    return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value


def test_an_address_in_this_process_is_named_from_its_library_symbols():
    maps = ProcessMaps()
    maps.capture([os.getpid()])
    with open("/proc/self/comm") as f:
        me = f.read().strip()
    names = UserSymbols(maps)
    addr = own_function("getpid")
    (inside,) = names.frames(os.getpid(), me, [addr + 3])
    libc = next(m.path for m in maps.mappings(os.getpid(), me) if m.start <= addr < m.end)
    assert inside.module == libc and "libc" in libc
    assert inside.symbol.endswith("getpid") and inside.offset == 3, inside
    # its address is the library's own (as objdump and perf print it), not this process's
    mapping = next(m for m in maps.mappings(os.getpid(), me) if m.start <= addr < m.end)
    elf = ElfSymbols(maps.files[mapping.file])
    assert inside.addr == elf.address(addr + 3 - mapping.start + mapping.offset)
    assert inside.addr != addr + 3 and elf.name(inside.addr) == (inside.symbol, 3)
    assert inside.perf() == f"{inside.addr:16x} {inside.symbol}+0x3 ({libc})"
    # an address no mapping of the process covers keeps its address, module unknown
    assert names.frames(os.getpid(), me, [0x10]) == [Frame(0x10, UNKNOWN, 0, UNKNOWN_MODULE)]
    # a process image not captured (another comm: an exec since) names nothing
    assert names.frames(os.getpid(), "other", [addr])[0].symbol == UNKNOWN


def test_a_file_that_is_not_the_one_mapped_is_not_read(tmp_path):
    maps = ProcessMaps()
    maps.capture([os.getpid()])
    libc = next(m for m in next(iter(maps.images.values())) if "libc" in m.path)
    other = ProcessMaps()
    swapped = Mapping(libc.start, libc.end, libc.offset, libc.dev, libc.inode + 1, libc.path)
    other.images[(os.getpid(), "x")] = [swapped]
    other.capture([])  # nothing new: only what capture() itself opened is held
    # its path, where there is no map_files entry to open, must be the file the maps name
    assert _open_mapped(str(tmp_path), os.getpid(), swapped) is None
    fd = _open_mapped(str(tmp_path), os.getpid(), libc)
    assert fd is not None
    os.close(fd)
    f = UserSymbols(other).frames(os.getpid(), "x", [libc.start + 0x10])[0]
    # the address (in the file's layout) and the path
    assert f == Frame(libc.offset + 0x10, UNKNOWN, 0, libc.path)
    maps.close()
    assert not maps.files


@pytest.mark.host  # /proc/PID/map_files: root's (CAP_SYS_ADMIN)
def test_a_file_deleted_after_its_capture_is_still_named(tmp_path):
    """The capture holds the mapped file itself (its map_files entry), not its path."""
    maps = ProcessMaps()
    maps.capture([os.getpid()])
    me = next(iter(maps.images))
    real = next(m for m in maps.images[me] if m.start <= own_function("getpid") < m.end)
    file_offset = own_function("getpid") - real.start + real.offset
    copy = tmp_path / "libcopy.so"
    shutil.copyfile(real.path, copy)
    with open(copy, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)
    try:
        with open("/proc/self/maps") as f:
            line = next(x for x in f if x.rstrip().endswith(str(copy)))
        start = int(line.split("-")[0], 16)
        fresh = ProcessMaps()
        fresh.capture([os.getpid()])
        copy.unlink()  # after the capture: gone from the disk, still mapped and held
        assert any(m.path == str(copy) for m in fresh.images[me])
        frame = UserSymbols(fresh).frames(os.getpid(), me[1], [start + file_offset])[0]
        assert frame.symbol.endswith("getpid") and frame.module == str(copy), frame
        fresh.close()
    finally:
        mapped.close()
    maps.close()


def test_a_file_without_symtab_is_named_from_its_debug_file(tmp_path):
    """As perf: a stripped file's local functions are in the debug file its build id names."""
    shim = Path(xhagent.daemon.exec.__file__).with_name("xhagent-shim")
    stripped = tmp_path / "shim"
    subprocess.run(["strip", "-o", str(stripped), str(shim)], check=True)
    fd = os.open(stripped, os.O_RDONLY)
    try:
        bare = ElfSymbols(fd, str(tmp_path / "nothing"))
        assert bare.build_id and len(bare.build_id) == 40
        root = tmp_path / "debug"
        (root / bare.build_id[:2]).mkdir(parents=True)
        shutil.copyfile(shim, root / bare.build_id[:2] / f"{bare.build_id[2:]}.debug")
        named = ElfSymbols(fd, str(root))
    finally:
        os.close(fd)
    with open(shim, "rb") as f:
        main = ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name("main")[0]
        text = next(
            s
            for s in ELFFile(f).iter_segments()
            if s["p_type"] == "PT_LOAD"
            and s["p_vaddr"] <= main["st_value"] < s["p_vaddr"] + s["p_memsz"]
        )
        at = main["st_value"] - text["p_vaddr"] + text["p_offset"] + 4
    assert named.address(at) == main["st_value"] + 4
    assert named.name(named.address(at)) == ("main", 4)
    assert (
        bare.name(bare.address(at)) is None
    )  # a static program's .dynsym (none) does not name main


def test_gone_processes_are_counted_and_the_images_bounded(tmp_path):
    proc = tmp_path / "proc"
    for pid in range(1, 4):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(f"p{pid}\n")
        (proc / str(pid) / "maps").write_text(MAPS)
    maps = ProcessMaps(str(proc))
    maps.capture([1, 2, 1, 99])  # 1 twice: read once; 99 is gone
    assert sorted(maps.images) == [(1, "p1"), (2, "p2")] and maps.missed == 1
    assert len(maps.mappings(2, "p2")) == 3
    maps.images |= {(1000 + i, "x"): [] for i in range(MAX_PROCESSES)}
    maps.capture([3])
    assert (3, "p3") not in maps.images and maps.missed == 2


def test_a_young_image_is_read_again_and_keeps_what_it_unmapped(tmp_path):
    """A first look can come between the exec and the loader mapping the libraries."""
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "comm").write_text("ping\n")
    exe, libc, jit = MAPS.splitlines()[1], MAPS.splitlines()[3], MAPS.splitlines()[5]
    now = [100.0]
    maps = ProcessMaps(str(proc), clock=lambda: now[0])
    (proc / "7" / "maps").write_text(exe + "\n")
    maps.capture([7])
    assert [m.path for m in maps.mappings(7, "ping")] == ["/usr/bin/ping"]
    (proc / "7" / "maps").write_text("\n".join([exe, libc, jit]) + "\n")
    now[0] += 0.001
    maps.capture([7])  # read just now: not again yet
    assert len(maps.mappings(7, "ping")) == 1
    now[0] += 0.05
    maps.capture([])  # not seen again since (asleep): read all the same, once due
    assert len(maps.mappings(7, "ping")) == 3
    now[0] += 0.05
    maps.capture([])
    assert not maps._waiting
    (proc / "7" / "maps").write_text("\n".join([exe, libc]) + "\n")  # jit unmapped
    now[0] += 0.05
    maps.capture([7])
    assert [m.path for m in maps.mappings(7, "ping")][-1] == "/memfd:jit (deleted)"
    (proc / "7" / "maps").write_text(exe + "\n")
    now[0] += 5  # old: read again only every few seconds
    maps.capture([7])
    now[0] += 0.5
    (proc / "7" / "maps").write_text("\n".join([exe, libc, jit]) + "\n")
    maps.capture([7])
    assert maps.missed == 0 and len(maps.mappings(7, "ping")) == 3


USER = [
    Frame(0x7F3A3C700010, "__GI___libc_read", 0x10, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
    Frame(0x55D0C0A01234, "main", 0x34, "/usr/bin/ping"),
]
KSTACK = [Frame(0xFFFFFFFF81200628, "__schedule", 0x628, KERNEL)]


def test_a_switch_out_names_its_kernel_then_its_user_frames():
    stacks = decode_section(encode_section({7: KSTACK}, {(100, 3): USER}))
    assert stacks.kernel == {7: KSTACK} and stacks.user == {(100, 3): USER}
    assert stacks.of(8, 4, 100) == KSTACK + USER
    assert stacks.of(0, 4, 100) == USER  # user only
    assert stacks.of(8, 4, 200) == KSTACK  # the id means another stack in another process
    assert stacks.of(0, 0, 100) == [] and not Stacks()


def test_the_perf_export_prints_user_frames_after_kernel_frames(tmp_path):
    ms = 1_000_000
    out_ev = switch(2 * ms, 0, 100, "ping", S, 0, "swapper/0")._replace(aux=8, ustack=4)
    events = [switch(1 * ms, 0, 0, "swapper/0", R, 100, "ping"), out_ev]
    header = sample_header()
    header.meta["stacks"] = {"kind": "both"}
    path = tmp_path / "u.xht"
    write_trace(path, header, events, encode_section({7: KSTACK}, {(100, 3): USER}))
    text = io.StringIO()
    write_perf(TraceFile(path), text)
    head, *frames = text.getvalue().split("\n\n")[1].split("\n")
    assert "prev_comm=ping" in head
    assert frames == [
        "\tffffffff81200628 __schedule+0x628 ([kernel.kallsyms])",
        "\t    7f3a3c700010 __GI___libc_read+0x10 (/usr/lib/x86_64-linux-gnu/libc.so.6)",
        "\t    55d0c0a01234 main+0x34 (/usr/bin/ping)",
    ]


def test_a_process_cgroup_is_its_cgroup2_line_and_selects_below_it():
    from xhagent.trace.offcpu import in_cgroup
    from xhagent.trace.ustacks import cgroup_of

    assert cgroup_of("12:pids:/x\n0::/a/b\n") == "/a/b" and cgroup_of("0::\n") == "/"
    assert cgroup_of("3:cpu:/v1 only\n") is None
    meta = {"stacks": {"cgroups": {"/a": [1], "/a/b": [2, 3], "/ab": [4], "/": [5]}}}
    assert in_cgroup(meta, "/a") == {1, 2, 3}  # not /ab
    assert in_cgroup(meta, "/a/b/") == {2, 3} and in_cgroup(meta, "/") == {1, 2, 3, 4, 5}
    assert in_cgroup(meta, "/none") == set()
    assert in_cgroup({"stacks": {"kind": "kernel"}}, "/a") is None  # says nothing
