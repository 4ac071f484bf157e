"""`Sampler`: a set of small files (cgroup stat files, /proc/<pid>/stat) held open and re-read
at offset 0, all of them in one C call per sample.

Opening a file costs more than reading it (path walk, file setup: the floor of any
open/read/close scheme), and a fresh read at offset 0 regenerates a seq_file's or a kernfs
file's content, so a periodic reader keeps its files open. Each file goes one of two ways,
chosen per mount by `xhagent.io.nowait`: an io_uring read through a registered file for the
files io_uring reads inline, a pread from C for those whose reads io_uring would hand to an
io-wq worker (procfs, sysfs, cgroupfs), where the punt costs more than the read.
Inline is not always cheaper: on a tmpfs here a ring pass cost more than the same files
read by pread from C. So "auto" times its first samples both ways (TRIALS passes each,
taking turns) and keeps the ring only where its quickest pass beats pread's; `ring_kept`
says what it chose. A set that gains files the ring would read is timed again.

A sample is one read per file into a buffer of the file's own size; a file that fills its
buffer may be longer, so its buffer grows (GROWTH times, up to `max_bytes`) and the whole set
is read again, which keeps every sample a single pass over the files. After the first read of
a file its buffer is fitted to twice what it held: a thousand stat files then share a few
hundred KiB that stay in the CPU's cache between samples, where a page each would not.

Files that vanish are never shown with stale bytes: a read that fails with ENODEV (a removed
cgroup), ESRCH (an exited process) or ENOENT makes the file *gone*: it is closed, left out of
every sample and listed in `gone` until the caller drops it or asks to re-open it. A cgroup
(or any directory) re-created under the same name is seen by its directory's inode: its gone
files are re-opened and read in the same sample, and listed in `replaced` (their counters
started again).

One thread at a time: a Sampler holds one ring and one buffer.
"""

from __future__ import annotations

import errno
import os
import resource
import time
from array import array
from collections.abc import Iterable, Iterator
from itertools import compress

from ..errors import KernelError
from .nowait import Router
from .ring import Ring, UringError, ffi, lib

FIRST_READ = 4096
GROWTH = 16
MAX_BYTES = 1 << 20
FIT_MIN = 64  # bytes: the smallest buffer a file is fitted down to
MAX_PASSES = 8  # per sample: growth to max_bytes takes 3, re-opened files 1 more
GONE_ERRNOS = frozenset({errno.ENODEV, errno.ESRCH, errno.ENOENT})
VIA = ("auto", "uring", "pread")
TRIALS = 3  # passes timed each way ("auto") before the faster way is kept
_clock = time.perf_counter_ns

_LIVE, _GONE, _FAILED = 0, 1, 2  # per-file state: read each sample, vanished, could not open
_READ = (0).__le__  # res -> whether the file has bytes in this sample


def _error(code: int, path: str) -> OSError:
    return KernelError.from_errno(code, path)


def _open_noatime(path: str) -> int:
    """A sample is not a use of the file: O_NOATIME spares a regular file's inode an atime
    update (and the journal a write) per read. The kernel allows it to the file's owner and
    CAP_FOWNER; anyone else opens without it."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOATIME)
    except PermissionError:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


class Snapshot:
    """One sample, packed: every file's bytes back to back in `data` (one bytes object), file
    i's at `starts[i]`, `lengths[i]` long; lengths[i] < 0 (-errno) where file i has no bytes in
    this sample (gone, could not be opened or read). Indexes follow `paths`. Immutable: it
    stays valid after later samples."""

    __slots__ = ("data", "starts", "lengths", "paths", "files_read")

    def __init__(
        self,
        data: bytes,
        starts: array,
        lengths: array,
        paths: tuple[str, ...],
        files_read: int | None = None,
    ):
        self.data, self.starts, self.lengths, self.paths = data, starts, lengths, paths
        if files_read is None:
            files_read = sum(1 for n in lengths if n >= 0)
        self.files_read = files_read  # how many files have bytes in this sample

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes | None:
        n = self.lengths[i]
        if n < 0:
            return None
        a = self.starts[i]
        return self.data[a : a + n]

    def items(self) -> Iterator[tuple[str, bytes]]:
        """(path, bytes) of the files read in this sample, in index order."""
        data = self.data
        for p, a, n in zip(self.paths, self.starts, self.lengths, strict=True):
            if n >= 0:
                yield p, data[a : a + n]


class Sampler:
    """Keeps `paths` open (O_RDONLY | O_CLOEXEC, and O_NOATIME where allowed) and re-reads
    them all per `sample()`.

    `via`: "auto" (io_uring for the files it reads inline, pread for the rest, and pread for
    all once the first samples show the ring slower: `ring_kept`), "uring" or "pread" (every
    file that way). A file longer than `max_bytes` is reported in `errors`
    (EFBIG) rather than cut short. After each sample, `gone`, `replaced` and `errors` say which
    files have no fresh bytes and why (see the module's text); `stats` counts the reads made
    each way. A path that cannot be opened stays in the set and in `errors` until it is
    re-opened (`reopen`) or dropped.
    """

    def __init__(
        self,
        paths: Iterable[str | os.PathLike] = (),
        *,
        max_bytes: int = MAX_BYTES,
        first_read: int = FIRST_READ,
        via: str = "auto",
        entries: int = 256,
    ):
        if via not in VIA:
            raise ValueError(f"via must be one of {', '.join(VIA)}, not {via!r}")
        if not 0 < first_read <= max_bytes < 1 << 31:
            raise ValueError(
                f"need 0 < first_read <= max_bytes < 2 GiB, not {first_read} and {max_bytes}"
            )
        self.max_bytes, self.first_read, self.via = max_bytes, first_read, via
        self._paths: list[str] = []
        self._index: dict[str, int] = {}
        self._fd: list[int] = []
        self._slot: list[int] = []
        self._cap: list[int] = []
        self._state = bytearray()
        self._dir: list[tuple[int, int] | None] = []  # (st_dev, st_ino) of the directory at open
        self._open_errors: dict[int, OSError] = {}  # index -> why it could not be opened
        self.gone: frozenset[str] = frozenset()
        self.replaced: frozenset[str] = frozenset()
        self.errors: dict[str, OSError] = {}
        self._samples = self._reads_uring = self._reads_pread = self._repeats = 0
        self._n_uring = self._n_pread = 0  # reads per pass each way, for the layout in force
        self._all_live = False
        self._ring_ptr = ffi.NULL
        self._gone_count = 0
        self._dirty = True
        self._closed = False
        self._router = Router() if via == "auto" else None
        self._ring: Ring | None = None
        self._free_slots: list[int] = []
        self._table = 0  # registered-file slots
        self._table_refused = False
        self._complete = False  # the last read gave bytes for every file in the set
        self._fit_pending = False
        self._fit_pending_files: list[int] = []  # indexes opened since the last fit
        self._gone_changed = False
        self._gone_dirs: dict[str, list[int]] | None = None  # gone files by directory
        self._entries = entries
        self._ring_refused = via == "pread"
        # "auto": whether the ring's pass beat pread's (None: not timed yet), and while
        # timing, the (ring, pread) passes' nanoseconds
        self.ring_kept: bool | None = None
        self._trials: tuple[list[int], list[int]] | None = None
        self.add(paths)

    # -- the set ----------------------------------------------------------------------
    @property
    def paths(self) -> tuple[str, ...]:
        """Every path in the set, in index order (the order of Snapshot and `index`)."""
        return tuple(self._paths)

    def index(self, path: str | os.PathLike) -> int:
        return self._index[os.fsdecode(path)]

    def __len__(self) -> int:
        return len(self._paths)

    def __contains__(self, path) -> bool:
        return os.fsdecode(path) in self._index

    def add(self, paths: Iterable[str | os.PathLike]) -> None:
        """Open and add each path not in the set yet (at the end of the index order)."""
        new: dict[str, None] = {}  # in order, once each
        for p in paths:
            path = os.fsdecode(p)
            if "\0" in path:
                raise ValueError(f"embedded null byte in path {path!r}")
            if path not in self._index:
                new[path] = None
        by_uring = sum(1 for p in new if self._uring_way(p))
        if by_uring and self._have_ring():
            self._grow_table(self._table - len(self._free_slots) + by_uring)
            if self.via == "auto":  # the set's cost changes: time both ways again
                self.ring_kept, self._trials = None, None
        for path in new:
            i = len(self._paths)
            self._index[path] = i
            self._paths.append(path)
            self._fd.append(-1)
            self._slot.append(-1)
            self._cap.append(self.first_read)
            self._state.append(_FAILED)
            self._dir.append(None)
            self._open(i)
        self._dirty = True

    def drop(self, paths: Iterable[str | os.PathLike]) -> None:
        """Close and forget these paths (those not in the set are ignored); later indexes move
        down."""
        out = {self._index[q] for q in map(os.fsdecode, paths) if q in self._index}
        if not out:
            return
        for i in out:
            self._close_file(i)
        keep = [i for i in range(len(self._paths)) if i not in out]
        moved = {old: new for new, old in enumerate(keep)}
        opened = {moved[i]: e for i, e in self._open_errors.items() if i in moved}
        self._paths = [self._paths[i] for i in keep]
        self._fd = [self._fd[i] for i in keep]
        self._slot = [self._slot[i] for i in keep]
        self._cap = [self._cap[i] for i in keep]
        self._state = bytearray(self._state[i] for i in keep)
        self._dir = [self._dir[i] for i in keep]
        self._open_errors = opened
        self._fit_pending_files = [moved[i] for i in self._fit_pending_files if i in moved]
        self._index = {p: i for i, p in enumerate(self._paths)}
        self._gone_count = self._state.count(_GONE)
        self._gone_changed = True
        self._gone_dirs = None
        self.gone = frozenset(p for p in self.gone if p in self._index)
        self.errors = {p: e for p, e in self.errors.items() if p in self._index}
        self._dirty = True

    def drop_gone(self) -> list[str]:
        """Drop every gone file; returns their paths."""
        out = [p for p, s in zip(self._paths, self._state, strict=True) if s == _GONE]
        self.drop(out)
        return out

    def reopen(self, paths: Iterable[str | os.PathLike] | None = None) -> list[str]:
        """Open again, by path, these files (default: every gone one and every one that could not
        be opened); returns the paths that are open now. A path still missing stays gone."""
        if paths is None:
            which = [i for i, s in enumerate(self._state) if s != _LIVE]
        else:
            which = [self._index[q] for q in map(os.fsdecode, paths) if q in self._index]
        done = []
        for i in which:
            self._close_file(i)
            if self._open(i):
                done.append(self._paths[i])
        self._dirty = True
        self._sync_reports()
        return done

    # -- sampling ---------------------------------------------------------------------
    def sample(self) -> dict[str, bytes]:
        """{path: bytes} of every file read in this sample; files without fresh bytes are left
        out (see `gone`, `replaced`, `errors`)."""
        flags = self._read()
        data = self._view[: self._pos[-1]].tobytes()
        if flags & lib.XH_SAMPLE_NUL:  # binary content: the NULs between files cannot split it
            return {
                p: data[a : a + n]
                for p, a, n in zip(self._paths, self._pos, self._res, strict=False)
                if n >= 0
            }
        # One C pass cuts every file's bytes out (a bytes object per file is the cost this
        # form adds to the C call; slicing file by file cost twice as much).
        pieces = data.split(b"\0")
        if self._complete:
            # a copy of a dict of the paths is born at full size: no growing while filled
            out = self._keys.copy()
            out.update(zip(self._paths, pieces, strict=False))  # pieces: one more, empty
            return out
        return dict(compress(zip(self._paths, pieces, strict=False), map(_READ, self._res)))

    def sample_packed(self) -> Snapshot:
        """This sample without a Python object per file: one bytes object and two arrays."""
        self._read()
        return Snapshot(
            self._view[: self._pos[-1]].tobytes(),
            self._pos[:-1],
            self._res[:],
            tuple(self._paths),
            len(self._paths) if self._complete else None,
        )

    @property
    def stats(self) -> dict[str, int]:
        """Samples taken, reads made each way, and passes repeated (a buffer grew, a file was
        re-opened)."""
        return {
            "samples": self._samples,
            "uring": self._reads_uring,
            "pread": self._reads_pread,
            "regrown": self._repeats,
        }

    @property
    def ways(self) -> dict[str, int]:
        """The files a sample reads each way now: {"uring": n, "pread": n} (after the
        first sample; "auto" moves them all to pread once timing shows the ring slower)."""
        return {"uring": self._n_uring, "pread": self._n_pread}

    def _read(self) -> int:
        """One sample; returns the flags of its last C pass (XH_SAMPLE_*)."""
        if self._closed:
            raise ValueError("sample of a closed Sampler")
        if self._dirty or self._gone_count:
            return self._read_settling(None)
        if self._trials is not None:
            return self._read_timed()
        flags = lib.xh_sample(self._ring_ptr, self._c)
        self._reads_uring += self._n_uring
        self._reads_pread += self._n_pread
        if flags:
            return self._read_settling(flags)
        return self._clean()

    def _clean(self) -> int:
        """The end of a sample whose one pass read every file, none grown: the common case
        costs no Python per file."""
        self._samples += 1
        self._complete = self._all_live
        if self._open_errors:
            self.errors = {self._paths[i]: e for i, e in self._open_errors.items()}
        elif self.errors:
            self.errors = {}
        if self.replaced:
            self.replaced = frozenset()
        return 0

    def _read_timed(self) -> int:
        """A sample while "auto" times the ring against pread: the ways take turns, and
        after TRIALS clean passes each the one with the quickest pass is kept (a pass that
        needs settling is not counted)."""
        ring_ns, pread_ns = self._trials
        by_ring = len(ring_ns) <= len(pread_ns)
        start = _clock()
        flags = lib.xh_sample(self._ring_ptr if by_ring else ffi.NULL, self._c)
        took = _clock() - start
        if by_ring:
            self._reads_uring += self._n_uring
            self._reads_pread += self._n_pread
        else:
            self._reads_pread += self._live_count
        if flags:
            return self._read_settling(flags)
        (ring_ns if by_ring else pread_ns).append(took)
        if len(pread_ns) >= TRIALS:
            self._trials = None
            self.ring_kept = min(ring_ns) <= min(pread_ns)
            if not self.ring_kept:
                self._ring_ptr = ffi.NULL
                self._n_uring, self._n_pread = 0, self._live_count
        return self._clean()

    def _read_settling(self, flags: int | None) -> int:
        """A sample that has more to do than one pass: files to re-open, failures to sort
        out, buffers to grow. `flags`: those of a pass already made, None when none was."""
        self.replaced = frozenset()
        self.errors = {}
        replaced: set[str] = set()
        too_big = False
        if flags is None and self._gone_count:
            replaced |= self._reopen_recreated()
        for _ in range(MAX_PASSES):
            if flags is None:
                if self._dirty:
                    self._prepare()
                flags = lib.xh_sample(self._ring_ptr, self._c)
                self._reads_uring += self._n_uring
                self._reads_pread += self._n_pread
            if flags < 0:
                raise UringError.from_res(flags, "io_uring_enter (Sampler.sample)")
            again = False
            if flags & lib.XH_SAMPLE_FAILED:
                again = self._settle_failures(replaced)
            if flags & lib.XH_SAMPLE_FULL:
                grew, too_big = self._regrow()
                again = again or grew
            if not again:
                break
            self._repeats += 1
            flags = None
        else:  # still growing after every pass allowed: no file is shown cut short
            flags = self._give_up_growing()
        if self._fit_pending:
            self._fit()
        failed = flags & lib.XH_SAMPLE_FAILED
        self._complete = not failed and not too_big and self._all_live
        self._samples += 1
        if replaced:
            self.replaced = frozenset(replaced)
        self._sync_reports()
        return flags

    def _settle_failures(self, replaced: set[str]) -> bool:
        """Gone files closed (and re-opened when their directory is a new one); other errors
        reported. True when files were re-opened, to be read in this same sample."""
        vanished = False
        for i, n in enumerate(self._res):
            if n >= 0 or self._state[i] != _LIVE:
                continue
            if -n in GONE_ERRNOS:
                self._close_file(i)
                self._state[i] = _GONE
                self._gone_changed = True
                self._gone_dirs = None
                self._gone_count += 1
                vanished = True
            else:
                self.errors[self._paths[i]] = _error(n, self._paths[i])
        if not vanished:
            return False
        self._dirty = True
        fresh = self._reopen_recreated()
        replaced |= fresh
        return bool(fresh)

    def _reopen_recreated(self) -> set[str]:
        """Re-open the gone files whose directory exists again as another inode."""
        if self._gone_dirs is None:  # kept while no file comes or goes: one stat per directory
            self._gone_dirs = {}
            for i, s in enumerate(self._state):
                if s == _GONE:
                    self._gone_dirs.setdefault(os.path.dirname(self._paths[i]) or ".", []).append(i)
        out: set[str] = set()
        for d, files in list(self._gone_dirs.items()):
            try:
                st = os.stat(d)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == self._dir[files[0]]:
                continue
            for i in files:
                if self._open(i):
                    out.add(self._paths[i])
                else:  # not in the new directory: gone still, and not asked again for it
                    self._dir[i] = (st.st_dev, st.st_ino)
        if out:
            self._dirty = True
            self._gone_dirs = None
        return out

    def _regrow(self) -> tuple[bool, bool]:
        """Grow the buffers that came back full. Returns whether some did (read them all
        again) and whether some file is past `max_bytes` (reported, left out)."""
        grew = too_big = False
        for i, n in enumerate(self._res):
            if n >= 0 and n == self._cap_a[i]:
                if n >= self.max_bytes:
                    self.errors[self._paths[i]] = KernelError(
                        errno.EFBIG,
                        f"longer than the sampler's {self.max_bytes} bytes per file",
                        self._paths[i],
                    )
                    self._res[i] = -errno.EFBIG
                    too_big = True
                else:
                    self._cap[i] = min(n * GROWTH, self.max_bytes)
                    grew = True
        if grew:
            self._dirty = True
        return grew, too_big

    def _give_up_growing(self) -> int:
        for i, n in enumerate(self._res):
            if n >= 0 and n == self._cap_a[i]:  # the size it was read with, not the grown one
                self._res[i] = -errno.EAGAIN
                self.errors[self._paths[i]] = KernelError(
                    errno.EAGAIN, "kept growing past its buffer while read", self._paths[i]
                )
        return lib.XH_SAMPLE_FAILED

    def _fit(self) -> None:
        """Buffers of the files opened since the last fit shrink to twice what they held."""
        self._fit_pending = False
        for i in self._fit_pending_files:
            n = self._res[i] if i < len(self._res) else -1
            want = max(FIT_MIN, -(-2 * n // 64) * 64)
            if 0 <= n and want < self._cap[i]:
                self._cap[i] = want
                self._dirty = True
        self._fit_pending_files = []

    def _sync_reports(self) -> None:
        if self._gone_changed:
            self._gone_changed = False
            self.gone = frozenset(
                p for p, s in zip(self._paths, self._state, strict=True) if s == _GONE
            )
        for i, e in self._open_errors.items():
            self.errors.setdefault(self._paths[i], e)

    # -- files ------------------------------------------------------------------------
    def _open(self, i: int) -> bool:
        """Open file i (closed now); True when it is live afterwards."""
        path, was = self._paths[i], self._state[i]
        self._open_errors.pop(i, None)
        self._gone_changed = True
        self._gone_dirs = None
        if was == _GONE:
            self._gone_count -= 1
        try:
            fd = _open_noatime(path)
        except OSError as exc:
            if was != _FAILED and exc.errno in GONE_ERRNOS:  # it was there: it vanished
                self._state[i] = _GONE
                self._gone_count += 1
            else:
                self._state[i] = _FAILED
                self._open_errors[i] = _error(exc.errno or errno.EIO, path)
            self._dirty = True
            return False
        self._fd[i] = fd
        self._state[i] = _LIVE
        self._fit_pending = True
        self._fit_pending_files.append(i)
        try:
            st = os.stat(os.path.dirname(path) or ".")
            self._dir[i] = (st.st_dev, st.st_ino)
        except OSError:
            self._dir[i] = None
        if self._uring_way(path) and self._have_ring():
            self._slot[i] = self._register(fd)
        self._dirty = True
        return True

    def _close_file(self, i: int) -> None:
        if self._slot[i] >= 0:
            self._unregister(self._slot[i])
            self._slot[i] = -1
        if self._fd[i] >= 0:
            os.close(self._fd[i])
            self._fd[i] = -1

    def _uring_way(self, path: str) -> bool:
        return self.via == "uring" or (self.via == "auto" and not self._router.punted(path))

    def _have_ring(self) -> bool:
        """The ring, made for the first file that goes through it: a set of cgroup or /proc
        files (all read by pread) costs no ring at all."""
        if self._ring is None and not self._ring_refused:
            try:
                self._ring = Ring(self._entries)
            except OSError:  # no io_uring here (old kernel, seccomp): every file by pread
                self._ring_refused = True
        return self._ring is not None

    def _register(self, fd: int) -> int:
        """A registered-file slot now holding `fd`, or -1 (the file is read with pread)."""
        ring = self._ring
        if not self._free_slots and not self._grow_table(self._table + 1):
            return -1
        slot = self._free_slots.pop()
        if lib.io_uring_register_files_update(ring._ring, slot, ffi.new("int[1]", [fd]), 1) < 0:
            self._free_slots.append(slot)
            return -1
        return slot

    def _unregister(self, slot: int) -> None:
        lib.io_uring_register_files_update(self._ring._ring, slot, ffi.new("int[1]", [-1]), 1)
        self._free_slots.append(slot)

    def _grow_table(self, need: int) -> bool:
        """Register a larger (sparse) file table for at least `need` files, carrying the files
        registered so far. The kernel bounds the table by RLIMIT_NOFILE: past it, and where
        registration is refused, files go the pread way."""
        if need <= self._table:
            return True
        if self._table_refused:
            return False
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        want = max(64, 2 * self._table)
        while want < need:
            want *= 2
        want = min(want, soft if soft > 0 else 1 << 20)
        if want <= self._table:
            return False
        fds = [-1] * want
        for i, s in enumerate(self._slot):
            if s >= 0:
                fds[s] = self._fd[i]
        ring = self._ring
        if self._table:
            ring.unregister_files()
        try:
            ring.register_files(fds)
        except OSError:
            self._table = 0
            self._free_slots = []
            self._slot = [-1] * len(self._slot)  # nothing registered now: pread for all
            self._table_refused = True
            self._dirty = True
            return False
        self._free_slots += range(want - 1, self._table - 1, -1)
        self._table = want
        return True

    # -- the C call's arrays ----------------------------------------------------------
    def _prepare(self) -> None:
        """Lay out the buffer (file i at the sum of the caps before it) and the C call's
        arrays; done when the set or a buffer size changed, not per sample."""
        n = len(self._paths)
        live = [s == _LIVE for s in self._state]
        self._live_count = sum(live)
        offs, at = array("Q", bytes(8 * n)), 0
        for i in range(n):
            offs[i] = at
            at += 1 + (self._cap[i] if live[i] else 0)  # + 1: the NUL packed after each file
        self._arena = bytearray(max(at, 1))
        self._view = memoryview(self._arena)
        self._fd_a = array("i", [f if ok else -1 for f, ok in zip(self._fd, live, strict=True)])
        self._slot_a = array("i", [s if ok else -1 for s, ok in zip(self._slot, live, strict=True)])
        self._cap_a = array("I", self._cap)
        self._off_a = offs
        self._res = array("i", bytes(4 * n))
        self._pos = array("Q", bytes(8 * (n + 1)))
        c = ffi.new("struct xh_sample *")
        c.n = n
        c.depth = self._ring.cq_entries if self._ring is not None else 1
        self._keep = [
            ffi.from_buffer("int32_t[]", self._fd_a),
            ffi.from_buffer("int32_t[]", self._slot_a),
            ffi.from_buffer(self._arena),
            ffi.from_buffer("uint64_t[]", self._off_a),
            ffi.from_buffer("uint32_t[]", self._cap_a),
            ffi.from_buffer("int32_t[]", self._res),
            ffi.from_buffer("uint64_t[]", self._pos),
        ]
        c.fd, c.slot, c.base, c.off, c.cap, c.res, c.pos = self._keep
        self._c = c
        by_ring = self._ring_live and self.ring_kept is not False
        self._ring_ptr = self._ring._ring if by_ring else ffi.NULL
        self._all_live = self._live_count == n
        self._keys = dict.fromkeys(self._index)  # a dict's keys: sized once (see sample)
        self._n_uring = sum(1 for s in self._slot_a if s >= 0) if by_ring else 0
        self._n_pread = self._live_count - self._n_uring
        if self.via == "auto" and self._n_uring and self.ring_kept is None and self._trials is None:
            self._trials = ([], [])
        self._dirty = False

    @property
    def _ring_live(self) -> bool:
        return self._ring is not None and self._table > 0

    # -- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in self._fd:
            if fd >= 0:
                os.close(fd)
        self._fd = [-1] * len(self._fd)
        if self._ring is not None:
            self._ring.close()

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


__all__ = ["GONE_ERRNOS", "MAX_BYTES", "Sampler", "Snapshot"]
