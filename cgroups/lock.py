"""One writer at a time per subtree: an exclusive flock on a lock file kept for it.

Two `apply --prune` runs at once on one subtree interleave their mkdir and rmdir and leave a
tree matching neither policy; `freeze`, `kill` and `run` race with them the same way. Every
command that changes a subtree takes its lock first and keeps it until the change is done.

The lock files live in LOCK_DIR (`/run/xhagent/locks`, mode 0700, created on first use), one
per subtree, named by the subtree's path (`%2Fsys%2Ffs%2Fcgroup%2Fxhagent.slice.lock`). They
are never deleted: removing a lock file another process holds open would let a third one lock
a new file of the same name. The holder writes its pid into the file so a waiter can say whom
it waits for. The kernel drops an flock when its holder exits, however it exits.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from .group import CgroupError

LOCK_DIR = Path("/run/xhagent/locks")


class LockBusy(CgroupError):
    """The subtree is locked by another process and the caller would not wait."""


def lock_path(subtree: Path, lock_dir: Path) -> Path:
    name = quote(os.path.realpath(subtree), safe="")
    if len(name) > 200:  # deep subtrees: a name within NAME_MAX, still one per subtree
        name = name[:120] + "-" + hashlib.sha256(name.encode()).hexdigest()[:32]
    return lock_dir / f"{name}.lock"


def _lock_dir(lock_dir: Path) -> None:
    try:
        for d in (lock_dir.parent, lock_dir):  # /run/xhagent too: 0700 when this creates it
            d.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(lock_dir)
    except OSError as exc:
        raise CgroupError(exc.errno, f"lock directory {lock_dir}: {exc.strerror}") from None
    # Only ours: a directory others can write would let them plant or hold our lock files.
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise CgroupError(
            errno.EPERM,
            f"lock directory {lock_dir} is not a directory owned by uid "
            f"{os.geteuid()} and writable only by it",
        )


class SubtreeLock:
    """`with SubtreeLock(path).acquire(): ...` or acquire() ... release()."""

    def __init__(self, subtree: Path, lock_dir: Path | None = None):
        self.subtree, self.path = subtree, lock_path(subtree, lock_dir or LOCK_DIR)
        self.fd: int | None = None

    def holder(self) -> int | None:
        """The pid written by the current holder, when it can be read."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def acquire(
        self, wait: bool = True, on_wait: Callable[[int | None], None] | None = None
    ) -> SubtreeLock:
        _lock_dir(self.path.parent)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise CgroupError(exc.errno, f"lock file {self.path}: {exc.strerror}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = self.holder()
                who = f"pid {pid}" if pid else "another process"
                if not wait:
                    raise LockBusy(
                        errno.EWOULDBLOCK,
                        f"{self.subtree} is being changed by {who} "
                        f"(lock {self.path}); not waiting (--no-wait)",
                    ) from None
                if on_wait:
                    on_wait(pid)
                fcntl.flock(fd, fcntl.LOCK_EX)  # a signal handler that raises ends the wait
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> SubtreeLock:
        if self.fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
