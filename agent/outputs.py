"""Output files written whole or not at all.

The agent runs as root, so `-o PATH` can name anything: a file the user wants to keep if
the run fails, or /dev/null. Output therefore goes to a temporary file beside PATH (same
directory, so the final rename is atomic; O_EXCL, mode 0600 while it is incomplete) and is
renamed over PATH only once it is complete. A failed or interrupted run removes only that
temporary file, never PATH. A PATH that exists and is not a regular file is refused before
anything is written; a symbolic link is followed, so its target is what gets replaced.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from .signals import signals_held

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFIFO: "a FIFO",
}


class OutputError(ValueError):
    """An output path that cannot be used (bad input: it is checked before any work)."""


class OutputFile:
    """A temporary file beside `path`; `fd` is open read-write. See atomic_output()."""

    @staticmethod
    def check(path: str) -> tuple[str, os.stat_result | None]:
        """Where `path` leads and what is there now; OutputError if it cannot be an output."""
        target = os.path.realpath(path)
        try:
            st = os.stat(target)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise OutputError(f"{path}: cannot write: {exc.strerror}") from None
        if st is not None and not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise OutputError(f"{path}: is {kind}; the output must be a regular file or a new name")
        parent = os.path.dirname(target)
        if not os.path.isdir(parent):
            raise OutputError(f"{path}: directory {parent} does not exist")
        return target, st

    def __init__(self, path: str, mode: int = 0o644):
        self.path = path
        target, st = self.check(path)
        parent = os.path.dirname(target)
        self.target = target
        # an existing file keeps its mode; a new one gets `mode` less the umask, as open() does
        self.mode = stat.S_IMODE(st.st_mode) if st else mode & ~_umask()
        self.owner = (st.st_uid, st.st_gid) if st else None
        base = os.path.basename(target)
        for n in range(100):
            tmp = os.path.join(parent, f".{base}.{os.getpid()}.{n}.tmp")
            try:
                self.fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                break
            except FileExistsError:
                continue
            except OSError as exc:  # named by the user's path, not the temporary one
                raise OSError(exc.errno, exc.strerror, path) from None
        else:
            raise OSError(errno.EEXIST, f"no free temporary name in {parent}", path)
        self.tmp: str | None = tmp

    def commit(self) -> None:
        """Give the file its final mode and put it in place of `path`."""
        self.check(self.path)  # again: what it is may have changed while this ran
        with signals_held():  # renamed and forgotten together, or neither
            os.fchmod(self.fd, self.mode)
            if self.owner is not None and self.owner != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(self.fd, *self.owner)
                except PermissionError:
                    pass  # not root: the replacement is ours, as with any rewrite
            os.fsync(self.fd)
            os.rename(self.tmp, self.target)
            self.tmp = None

    def close(self) -> None:
        """Close; the temporary file is removed unless commit() ran."""
        with signals_held():
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            if self.tmp is not None:
                try:
                    os.unlink(self.tmp)  # created by this run (O_EXCL), so ours to remove
                except FileNotFoundError:
                    pass
                self.tmp = None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_output(path: str, mode: int = 0o644) -> Iterator[OutputFile]:
    """Write through `.fd`; committed when the block ends normally, removed otherwise."""
    out = None
    try:
        with signals_held():  # a signal cannot come between creating the file and knowing it
            out = OutputFile(path, mode)
        yield out
        if out.tmp is not None:
            out.commit()
    finally:
        if out is not None:
            out.close()


def write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written (a write may be short)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
