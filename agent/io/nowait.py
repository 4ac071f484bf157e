"""Which files io_uring reads inline, and which it hands to an io-wq worker.

io_uring first tries a read without blocking. A file opened without FMODE_NOWAIT cannot be
tried that way, so every read of it is punted to an io-wq worker thread, and for the small
files of /proc, sysfs and cgroupfs (seq_file and kernfs) the punt costs more than the read:
read through openat -> read -> close chains they came out slower than a plain
open/read/close loop (docs/benchmarks.md, `bench io`). `read_files` reads such files with system
calls from C instead.

The kernel says which files those are: `preadv2(RWF_NOWAIT)` fails with EOPNOTSUPP on
exactly the files that lack FMODE_NOWAIT. A `Router` asks once per mount, with the first
path it is given there, and routes the mount's other paths the same way (the mount of a path
is the deepest mount point that prefixes it, from the mount table read when the Router was
made). A path that leaves its mount through a symlink, or a mount made later, may take the
slower way; the bytes read are the same either way.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

from .. import mountinfo

_DIR_CACHE_LIMIT = 8192  # /proc/<pid> directories come and go


def refuses_nowait(path: str) -> bool | None:
    """True when `path` lacks FMODE_NOWAIT, False when it has it, None when this file cannot
    tell (missing, not a regular file). Reads at most one byte at offset 0, without
    blocking and without moving the file position."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a directory refuses RWF_NOWAIT too, whatever its file system
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            return True
        return False if exc.errno == errno.EAGAIN else None
    finally:
        os.close(fd)
    return False


class Router:
    def __init__(
        self,
        mounts: list[mountinfo.MountEntry] | None = None,
        probe: Callable[[str], bool | None] = refuses_nowait,
    ):
        if mounts is None:
            try:
                mounts = mountinfo.read()
            except OSError:  # no /proc: nothing is known, everything goes through io_uring
                mounts = []
        self._points = {m.path for m in mounts}
        self._probe = probe
        self._mount_of_dir: dict[str, str | None] = {}
        self._punted: dict[str, bool] = {}  # mount point -> the kernel's answer

    def mount_point(self, path: str) -> str | None:
        """The deepest mount point that prefixes `path` (None for a relative path)."""
        if not path.startswith("/"):
            return None
        while path not in self._points:
            if path == "/":
                return None
            path = path.rpartition("/")[0] or "/"
        return path

    def punted(self, path: str) -> bool:
        """Whether io_uring would hand every read of `path` to an io-wq worker."""
        head, sep, _ = path.rpartition("/")
        directory = head or sep or "."
        try:
            point = self._mount_of_dir[directory]
        except KeyError:
            if len(self._mount_of_dir) >= _DIR_CACHE_LIMIT:
                self._mount_of_dir.clear()
            point = self._mount_of_dir[directory] = self.mount_point(directory)
        if point is None:
            return False
        known = self._punted.get(point)
        if known is None:
            known = self._probe(path)
            if known is None:  # ask again with this mount's next path
                return False
            self._punted[point] = known
        return known

    def answers(self) -> dict[str, bool]:
        """Mount point -> whether its files' reads are punted, for the mounts asked so far."""
        return dict(self._punted)
