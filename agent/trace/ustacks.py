"""User stacks of a trace: what their addresses mean, captured while the processes live.

A user stack is a list of addresses in one process's address space. While recording, each
process whose user stack was taken (the BPF program names them: `SchedTrace.stacked_tgids`) has
its executable file mappings read from /proc/PID/maps, once per process image (tgid and
comm: an exec changes both the mappings and the comm), and each mapped file not seen before
is opened then through /proc/PID/map_files, which gives the very file mapped even once it is
deleted or replaced on disk. At the end the addresses are named from those files' ELF symbol
tables (`.symtab`, else the detached debug file that the build id names under
/usr/lib/debug/.build-id, as perf looks for it, else `.dynsym`; read with pyelftools), so
that the trace names its frames after the processes and even the files are gone.

A frame's module is the mapped file's path, as `perf script` prints it; an address in no
captured mapping, or in a file that cannot be read, keeps its address (symbol "[unknown]").
"""

from __future__ import annotations

import os
import stat
import time
from bisect import bisect_right
from dataclasses import dataclass

from .stacks import UNKNOWN, Frame

MAX_PROCESSES = 4096  # process images whose mappings a recording keeps
MAX_MAPPINGS = 512  # executable file mappings kept of one process
# Mapped files one recording holds open, and so can name: a Python process alone maps over a
# hundred shared objects; the agent's LimitNOFILE leaves room for its recordings at once.
MAX_FILES = 1024
MAX_ELF_BYTES = 4 << 30
# A process image is read again when seen again: every REREAD_YOUNG_S in its first YOUNG_S
# (the dynamic loader maps its libraries after the exec), then every REREAD_OLD_S.
YOUNG_S, REREAD_YOUNG_S, REREAD_OLD_S = 2.0, 0.02, 2.0
UNKNOWN_MODULE = "[unknown]"
DEBUG_ROOT = "/usr/lib/debug/.build-id"


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int  # of the file, at `start`
    dev: tuple[int, int]  # (major, minor)
    inode: int
    path: str

    @property
    def file(self) -> tuple[tuple[int, int], int]:
        return self.dev, self.inode


def parse_maps(text: str) -> list[Mapping]:
    """The executable mappings of files, from /proc/PID/maps' text."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        try:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            major, minor = (int(x, 16) for x in parts[3].split(":"))
            out.append(Mapping(lo, hi, int(parts[2], 16), (major, minor), int(parts[4]), parts[5]))
        except ValueError:
            continue
        if len(out) == MAX_MAPPINGS:
            break
    return out


def _usable(fd: int, m: Mapping | None) -> bool:
    """A regular file of a readable size and, for `m`, the very file it names (device and
    inode as /proc/PID/maps says: what a path opened later must prove)."""
    st = os.fstat(fd)
    same = m is None or ((os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino) == m.file
    return stat.S_ISREG(st.st_mode) and st.st_size <= MAX_ELF_BYTES and same


def _open_mapped(proc: str, tgid: int, m: Mapping) -> int | None:
    """An fd of the file `m` maps in process `tgid`: its map_files entry (the kernel's own
    file of the mapping: no check needed, and on 9p the inode that fstat reports is not the
    one the maps show), else its path if that is still the same file; None if neither."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    for path, more, check in (
        (f"{proc}/{tgid}/map_files/{m.start:x}-{m.end:x}", 0, None),
        (m.path, os.O_NOFOLLOW, m),
    ):
        try:
            fd = os.open(path, flags | more)
        except OSError:
            continue
        try:
            if _usable(fd, check):
                return fd
        except OSError:
            pass
        os.close(fd)
    return None


def _merged(old: list[Mapping], new: list[Mapping]) -> list[Mapping]:
    """The mappings read now, and those of an earlier read that none of them overlaps (a
    library unmapped since still names the frames taken while it was mapped)."""
    starts = [n.start for n in new]  # sorted and disjoint, as /proc/PID/maps lists them

    def overlapped(o: Mapping) -> bool:
        i = bisect_right(starts, o.end - 1) - 1  # the last one starting before o ends
        return i >= 0 and new[i].end > o.start

    kept = [o for o in old if not overlapped(o)]
    return sorted(new + kept, key=lambda m: m.start)[:MAX_MAPPINGS]


def cgroup_of(text: str) -> str | None:
    """The cgroup v2 path of a /proc/PID/cgroup text (its `0::` line), or None."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


class ProcessMaps:
    """What a recording with stacks learns of each process whose stacks it took, while the
    process lives: its cgroup v2 path when last seen (`cgroups`); with `mappings` (user
    stacks), its mappings by (tgid, comm) and their files, held open (MAX_FILES at most)
    until close()."""

    def __init__(self, proc: str = "/proc", clock=time.monotonic, mappings: bool = True):
        self.proc = proc
        self.clock = clock
        self.want_mappings = mappings
        self.cgroups: dict[int, str] = {}  # tgid -> cgroup v2 path (MAX_PROCESSES at most)
        self.images: dict[tuple[int, str], list[Mapping]] = {}
        self._read: dict[tuple[int, str], tuple[float, float]] = {}  # first and last read
        self._waiting: list[int] = []  # seen again before their image was due
        self.files: dict[tuple[tuple[int, int], int], int] = {}  # (dev, inode) -> fd
        self.unread: set[tuple[tuple[int, int], int]] = set()  # files not held: past the cap,
        # or neither their map_files entry nor their path opened the file mapped
        self.missed = 0  # processes gone before their mappings were first read, or past the cap

    def _due(self, key: tuple[int, str], now: float) -> bool:
        """Whether an image seen again is read again: a young one often (the dynamic loader
        maps the libraries after the exec, and a first look may come before it), an old
        one rarely (a dlopen)."""
        if key not in self._read:
            return True
        first, last = self._read[key]
        return now - last >= (REREAD_YOUNG_S if now - first < YOUNG_S else REREAD_OLD_S)

    def capture(self, tgids) -> None:
        """Read the cgroup and the mappings of the processes `tgids` (those whose stacks were
        taken since the last call): a cgroup each time, an image once and again while young."""
        now = self.clock()
        # a process seen again before its image is due keeps its place: the kernel says it
        # once a switch-out, and one asleep meanwhile would never be read again
        due, self._waiting = list(dict.fromkeys([*self._waiting, *tgids])), []
        for tgid in due:
            if tgid in self.cgroups or len(self.cgroups) < MAX_PROCESSES:
                try:  # each time it is seen: a process may move
                    with open(
                        f"{self.proc}/{tgid}/cgroup", encoding="utf-8", errors="replace"
                    ) as f:
                        path = cgroup_of(f.read())
                except OSError:
                    path = None  # gone: counted below, where its mappings are
                if path is not None:
                    self.cgroups[tgid] = path
            if not self.want_mappings:
                continue
            try:
                with open(f"{self.proc}/{tgid}/comm", encoding="utf-8", errors="replace") as f:
                    comm = f.read().rstrip("\n")
                key = (tgid, comm)
                if not self._due(key, now):
                    if len(self._waiting) < MAX_PROCESSES:
                        self._waiting.append(tgid)
                    continue
                if key not in self.images and len(self.images) >= MAX_PROCESSES:
                    self.missed += 1
                    continue
                with open(f"{self.proc}/{tgid}/maps", encoding="utf-8", errors="replace") as f:
                    mappings = parse_maps(f.read())
            except OSError:  # it exited first: missed, unless an earlier look had it
                if not any(t == tgid for t, _ in self.images):
                    self.missed += 1
                continue
            self.images[key] = _merged(self.images.get(key, []), mappings)
            self._read[key] = (self._read.get(key, (now, now))[0], now)
            for m in mappings:
                if m.file in self.files or m.file in self.unread:
                    continue
                fd = _open_mapped(self.proc, tgid, m) if len(self.files) < MAX_FILES else None
                if fd is None:
                    self.unread.add(m.file)
                else:
                    self.files[m.file] = fd

    def mappings(self, tgid: int, comm: str) -> list[Mapping] | None:
        return self.images.get((tgid, comm))

    def close(self) -> None:
        for fd in self.files.values():
            os.close(fd)
        self.files.clear()

    def __enter__(self) -> ProcessMaps:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _build_id(elf) -> str | None:
    for section in elf.iter_sections():
        if section["sh_type"] != "SHT_NOTE":
            continue
        for note in section.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return str(note["n_desc"])
    return None


def _preference(name: str, bind: str, size: int) -> tuple:
    """How perf chooses among the names of one address: one with a size, not weak, global,
    the fewest leading underscores, the longest (`read` over `__read`, `__GI___libc_write`
    over the weak `write`), so that both name a frame alike."""
    return (
        size > 0,
        bind != "STB_WEAK",
        bind == "STB_GLOBAL",
        -(len(name) - len(name.lstrip("_"))),
        len(name),
    )


def _functions(elf, section: str) -> dict[int, tuple[str, int]]:
    """address -> (name, size) of the function symbols of `section`, one name an address."""
    table = elf.get_section_by_name(section)
    best: dict[int, tuple[tuple, str, int]] = {}
    if table is None or not hasattr(table, "iter_symbols"):
        return {}
    for sym in table.iter_symbols():
        kind = sym["st_info"]["type"]
        if kind not in ("STT_FUNC", "STT_GNU_IFUNC") or not sym["st_value"] or not sym.name:
            continue
        size = sym["st_size"]
        rank = _preference(sym.name, sym["st_info"]["bind"], size)
        held = best.get(sym["st_value"])
        if held is None or rank > held[0]:
            best[sym["st_value"]] = (rank, sym.name, size)
    return {addr: (name, size) for addr, (_, name, size) in best.items()}


def _debug_symbols(build_id: str, debug_root: str) -> dict[int, tuple[str, int]]:
    """The function symbols of the detached debug file of `build_id`, if it is there."""
    from elftools.elf.elffile import ELFFile

    path = f"{debug_root}/{build_id[:2]}/{build_id[2:]}.debug"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return {}
        elf = ELFFile(f)
        return _functions(elf, ".symtab") if _build_id(elf) == build_id else {}


class ElfSymbols:
    """A file's function symbols and loadable segments, for naming addresses in it."""

    def __init__(self, fd: int, debug_root: str = DEBUG_ROOT):
        from elftools.elf.elffile import ELFFile

        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(0)
            elf = ELFFile(f)
            self.segments = [
                (s["p_offset"], s["p_filesz"], s["p_vaddr"])
                for s in elf.iter_segments()
                if s["p_type"] == "PT_LOAD"
            ]
            self.build_id = _build_id(elf)
            syms = _functions(elf, ".symtab")
            if not syms and self.build_id:
                syms = _debug_symbols(self.build_id, debug_root)
            if not syms:
                syms = _functions(elf, ".dynsym")
        ordered = sorted(syms.items())
        self._addrs = [a for a, _ in ordered]
        self._syms = [s for _, s in ordered]

    def address(self, file_offset: int) -> int | None:
        """The address in the file's own layout (what objdump and perf print) of the code
        at `file_offset`, or None where no loadable segment holds it."""
        for off, size, vaddr in self.segments:
            if off <= file_offset < off + size:
                return file_offset - off + vaddr
        return None

    def name(self, addr: int) -> tuple[str, int] | None:
        """(symbol, offset in it) of the code at `addr` (the file's layout), or None."""
        i = bisect_right(self._addrs, addr) - 1
        if i < 0:
            return None
        name, size = self._syms[i]
        if size and addr >= self._addrs[i] + size:
            return None  # past the nearest function's end: code no symbol names
        return name, addr - self._addrs[i]


class UserSymbols:
    """Names user addresses with the mappings of their process image; each file read once,
    from the fd the capture holds."""

    def __init__(self, maps: ProcessMaps, debug_root: str = DEBUG_ROOT):
        self.maps = maps
        self.debug_root = debug_root
        self._files: dict[tuple[tuple[int, int], int], ElfSymbols | None] = {}
        self.builds: dict[str, str] = {}  # path -> build id, of the files that named frames

    def _elf(self, m: Mapping) -> ElfSymbols | None:
        if m.file not in self._files:
            fd = self.maps.files.get(m.file)
            try:
                self._files[m.file] = None if fd is None else ElfSymbols(fd, self.debug_root)
            except Exception:  # not ELF, or an ELF pyelftools cannot read: addresses only
                self._files[m.file] = None
        return self._files[m.file]

    def frames(self, tgid: int, comm: str, ips: list[int]) -> list[Frame]:
        """The frames of user addresses `ips` of process image (tgid, comm). A frame in a
        mapped file has its address in the file's layout, as perf prints it; elsewhere the
        address as taken."""
        mappings = self.maps.mappings(tgid, comm) or []
        starts = [m.start for m in mappings]
        out = []
        for ip in ips:
            i = bisect_right(starts, ip) - 1
            m = mappings[i] if i >= 0 and ip < mappings[i].end else None
            if m is None:
                out.append(Frame(ip, UNKNOWN, 0, UNKNOWN_MODULE))
                continue
            at = ip - m.start + m.offset
            elf = self._elf(m)
            named = None
            if elf is not None:
                vaddr = elf.address(at)
                at = at if vaddr is None else vaddr
                named = elf.name(at)
                if elf.build_id:
                    self.builds[m.path] = elf.build_id
            out.append(Frame(at, *(named or (UNKNOWN, 0)), m.path))
        return out
