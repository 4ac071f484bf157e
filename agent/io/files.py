"""`read_files(paths)`: many small files (cgroup, /proc, sysfs: sizes of 4096 or 0 that mean
nothing) read in one C call per round.

Each file goes one of two ways, chosen per mount by `xhagent.io.nowait`: linked
openat -> read -> close chains through registered-file slots, a few submissions in all, for
files io_uring reads inline; open/read/close system calls from C for the files whose reads
io_uring would hand to an io-wq worker (procfs, sysfs, cgroupfs), where the punt costs more
than the read.

Rounds: every file is read once with a small buffer; a file that fills its buffer may be
longer, so it is read again from offset 0 with a buffer GROWTH times larger (one read per
file keeps a seq_file's content a single snapshot) until a read comes back short.
`FileRounds` is that plan, free of I/O; the sync and asyncio drivers share it.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence

from .nowait import Router
from .ring import Ring, UringError, ffi, lib

FIRST_READ = 4096
GROWTH = 16


class FileRounds:
    """Which files the current round reads (`pending`, each into a buffer of `size` bytes),
    and each file's outcome (bytes or OSError) once known."""

    def __init__(self, paths: Sequence[str | os.PathLike], first: int = FIRST_READ):
        self.paths = [os.fspath(p) for p in paths]
        self.results: list[bytes | OSError | None] = [None] * len(self.paths)
        self.size = first
        self.pending = list(range(len(self.paths)))
        self._again: list[int] = []

    def complete_round(self, res: Sequence[int], buf) -> None:
        """Every pending file at once: file pending[k] read res[k] bytes into buf[k * size:]."""
        view, size, results, again = memoryview(buf), self.size, self.results, self._again
        for k, index in enumerate(self.pending):
            n = res[k]
            if 0 <= n < size:
                start = k * size
                results[index] = view[start : start + n].tobytes()
            elif n == size:
                again.append(index)
            else:
                results[index] = UringError.from_res(n, self.paths[index])
        self.pending, self._again = self._again, []
        self.size *= GROWTH

    @property
    def done(self) -> bool:
        return not self.pending

    def encoded(self) -> bytes:
        """Every path, NUL-terminated, back to back (what the C loops read)."""
        try:
            blob = os.fsencode("\0".join(self.paths)) + b"\0"
        except TypeError:  # some paths are bytes
            blob = b"".join(os.fsencode(p) + b"\0" for p in self.paths)
        if blob.count(0) != len(self.paths):
            raise ValueError("read_files: embedded null byte in a path")
        return blob


# Linked chains run their next link as task work; deferring it to our own wait (6.1+)
# measured ~1.1-1.4x faster on /proc than running it on every transition.
PREFERRED_FLAGS = ("single_issuer", "defer_taskrun")


VIA = ("auto", "uring", "syscalls")


class FileReader:
    """A ring with `slots` registered-file slots for the chains; reuse it for periodic reads.

    `via` picks how files are read: "uring" (openat -> read -> close chains), "syscalls"
    (open/read/close from C, one file after another), or "auto": syscalls for the pseudo file
    systems whose reads io_uring would punt to io-wq (see xhagent.io.nowait), chains for
    the rest. `stats` counts the files read each way.

    By default the ring is single-issuer: use a FileReader from the thread that made it.
    """

    def __init__(
        self,
        entries: int = 256,
        slots: int | None = None,
        flags: tuple[str, ...] | None = None,
        via: str = "auto",
    ):
        if via not in VIA:
            raise ValueError(f"via must be one of {', '.join(VIA)}, not {via!r}")
        if flags is None:
            try:
                self.ring = Ring(entries, PREFERRED_FLAGS)
            except OSError:  # an older kernel: EINVAL for the flags it lacks
                self.ring = Ring(entries)
        else:
            self.ring = Ring(entries, flags)
        self.slots = slots or max(1, self.ring.entries // 3)
        self.ring.register_files([-1] * self.slots)
        self.via = via
        self.router = Router() if via == "auto" else None
        self.stats = {"uring": 0, "syscalls": 0}
        self._last_routes = (b"", b"")

    def read_files(
        self, paths: Sequence[str | os.PathLike], first: int = FIRST_READ
    ) -> list[bytes | OSError]:
        """One entry per path: its bytes, or the OSError (errno, path) of that file alone."""
        rounds = FileRounds(paths, first)
        blob = rounds.encoded()
        sync = self._routes(rounds.paths, blob)
        by_syscalls = sync.count(1)
        self.stats["syscalls"] += by_syscalls
        self.stats["uring"] += len(sync) - by_syscalls
        while not rounds.done:
            self._read_round(rounds, blob, sync)
        return rounds.results  # type: ignore[return-value]

    def _routes(self, paths: list, blob: bytes) -> bytes:
        """1 for each path to read with system calls; kept for a repeat of the same paths."""
        if self.router is None:
            return (b"\1" if self.via == "syscalls" else b"\0") * len(paths)
        if blob != self._last_routes[0]:
            punted = self.router.punted
            self._last_routes = (blob, bytes([punted(os.fsdecode(p)) for p in paths]))
        return self._last_routes[1]

    def _read_round(self, rounds: FileRounds, blob: bytes, sync: bytes) -> None:
        n, size = len(rounds.pending), rounds.size
        buf = bytearray(n * size)
        res = array("i", bytes(4 * n))
        f = ffi.new("struct xh_files *")
        f.n, f.slots, f.slot_base, f.npaths, f.len = n, self.slots, 0, len(rounds.paths), size
        keep = [
            ffi.from_buffer(blob),
            ffi.from_buffer(buf),
            ffi.from_buffer("int32_t[]", res),
            ffi.from_buffer("uint32_t[]", array("I", rounds.pending)),
            ffi.from_buffer("uint8_t[]", sync),
        ]
        f.paths, f.base, f.res, f.index, f.sync = keep
        err = lib.xh_read_files(self.ring._ring, f)
        if err < 0:
            raise UringError.from_res(err, "io_uring_enter (read_files)")
        rounds.complete_round(res, buf)

    def close(self) -> None:
        self.ring.close()

    def __enter__(self) -> FileReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_files(
    paths: Sequence[str | os.PathLike], first: int = FIRST_READ, via: str = "auto"
) -> list[bytes | OSError]:
    """Read every path with a throwaway FileReader; see FileReader.read_files."""
    with FileReader(via=via) as reader:
        return reader.read_files(paths, first)


def read_file_loop(paths: Sequence[str | os.PathLike]) -> list[bytes | OSError]:
    """The plain open/read/close loop read_files is measured against (and a reference)."""
    out: list[bytes | OSError] = []
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            out.append(exc)
            continue
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            out.append(b"".join(chunks))
        except OSError as exc:
            out.append(OSError(exc.errno, exc.strerror, os.fspath(p)))
        finally:
            os.close(fd)
    return out


__all__ = ["FileRounds", "FileReader", "read_files", "read_file_loop"]
