"""Reading files a user names: only what can be read to an end, and never without a bound.

`/dev/zero`, `/dev/urandom` or a tty given where a policy or a trace is expected would be read
until memory runs out, and opening some device nodes has side effects (a watchdog starts its
timer). So a path is checked with stat before it is opened: a regular file, or a FIFO or `-`
(standard input) where the user pipes input on purpose; anything else is refused by name.
Reads stop at a limit the caller states, and going past it is an error, not a truncation.
"""

from __future__ import annotations

import os
import stat
import sys


class InputError(ValueError):
    """A named input that cannot be used; reads `PATH: message`."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


def open_input(path: str) -> int:
    """An O_RDONLY|O_CLOEXEC descriptor of a regular file or FIFO (`-`: a dup of stdin)."""
    if path == "-":
        return os.dup(sys.stdin.fileno())
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror}") from None
    kind = stat.S_IFMT(st.st_mode)
    if kind not in (stat.S_IFREG, stat.S_IFIFO):
        raise InputError(path, f"is {_KINDS.get(kind, 'not a regular file')}, not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror}") from None
    if stat.S_IFMT(os.fstat(fd).st_mode) != kind:  # replaced between stat and open
        os.close(fd)
        raise InputError(path, "changed while being opened")
    return fd


def read_input(path: str, limit: int, what: str = "input") -> bytes:
    """All of `path`, which must not be longer than `limit` bytes."""
    fd = open_input(path)
    chunks, size = [], 0
    try:
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise InputError(path, f"is larger than {limit:,} bytes, the limit for {what}")
    return b"".join(chunks)
