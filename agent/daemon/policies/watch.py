"""Changes in one directory, from inotify: the policy directory the daemon watches.

Only whole files are reported: a file written in place is reported on its last close
(IN_CLOSE_WRITE), one renamed into the directory on the rename (editors and `install` write
a temporary file and rename it), a removed one on its removal. The fd is non-blocking, for
the daemon's selector; `changes()` drains what is queued.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_ONLYDIR = 0x01000000
MASK = IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class DirectoryWatch:
    """`changes()` -> names changed since the last call; `None` in the set means "the queue
    overflowed or the directory itself went away: rescan everything"."""

    def __init__(self, directory: Path):
        self.directory = directory
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        wd = _libc.inotify_add_watch(fd, os.fsencode(directory), MASK | IN_ONLYDIR)
        if wd < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"watching {directory}: {os.strerror(err)}", str(directory))
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def changes(self) -> set[str | None]:
        out: set[str | None] = set()
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return out
            offset = 0
            while offset + _EVENT.size <= len(data):
                _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                start = offset + _EVENT.size
                name = data[start : start + length].rstrip(b"\0")
                offset = start + length
                if mask & (IN_Q_OVERFLOW | IN_DELETE_SELF | IN_MOVE_SELF):
                    out.add(None)
                elif name:
                    out.add(os.fsdecode(name))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> DirectoryWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
