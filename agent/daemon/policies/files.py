"""One file of the policy directory read without waiting on it: the daemon's main thread
reads them, and that thread is also the one that takes SIGTERM, SIGINT and SIGHUP.

`xhagent policy validate` reads a FIFO on purpose (xhagent.inputs); the daemon does not: a
FIFO would hold `open()` until a writer came, a device may never end or act on being
opened, and neither is a policy an operator keeps. So a name is resolved with O_PATH first
(which opens nothing: no FIFO waits, no driver runs), refused unless it is a regular file,
then opened O_NONBLOCK and checked to be that same file, and read within spec.MAX_BYTES.

Symbolic links are followed only while they stay inside the directory (openat2 with
RESOLVE_BENEATH): a Kubernetes ConfigMap volume is made of such links (`p.yaml ->
..data/p.yaml`), while a link to /dev/zero, to /etc/shadow (whose text a located error
would quote back into the event stream) or through `..` is refused by name. Where openat2
is missing (Linux before 5.6, or a seccomp filter that refuses it) no link is followed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from pathlib import Path

from ...spec import MAX_BYTES, decode
from .sources import PolicyError

SYS_OPENAT2 = 437  # the same number on every architecture (added after the syscall tables merged)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link (links are followed only where openat2 is available)",
}


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_openat2_missing = False  # set once the kernel (or a seccomp filter) said ENOSYS/EPERM


def _open_beneath(dir_fd: int, name: str, flags: int) -> int:
    """`name` opened relative to `dir_fd`, links followed only inside it; OSError."""
    global _openat2_missing
    flags |= os.O_CLOEXEC
    if not _openat2_missing:
        how = _OpenHow(flags, 0, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
        fd = _libc.syscall(  # variadic: the long-sized arguments are passed as such
            ctypes.c_long(SYS_OPENAT2),
            ctypes.c_int(dir_fd),
            os.fsencode(name),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EPERM):
            raise OSError(err, os.strerror(err), name)
        _openat2_missing = True
    return os.open(name, flags | os.O_NOFOLLOW, dir_fd=dir_fd)


def _refusal(path: Path, exc: OSError) -> PolicyError:
    if exc.errno == errno.EXDEV:
        why = "is a symbolic link leading outside the policy directory: not followed"
    elif exc.errno == errno.ELOOP:
        why = "is a symbolic link that cannot be followed safely (a loop, or /proc magic)"
    else:
        why = f"cannot be read: {exc.strerror}"
    return PolicyError(f"{path}: {why}", invalid=False)


def read_policy_file(directory: Path, name: str) -> str | None:
    """The text of `directory/name`; None when there is no such file (or a link to
    nothing); PolicyError naming the file when it is not a regular file within bounds."""
    path = directory / name
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PolicyError(f"{directory}: cannot be read: {exc.strerror}", invalid=False) from None
    try:
        try:
            where = _open_beneath(dir_fd, name, os.O_PATH)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _refusal(path, exc) from None
        try:
            found = os.fstat(where)
        finally:
            os.close(where)
        kind = stat.S_IFMT(found.st_mode)
        if kind != stat.S_IFREG:
            what = KINDS.get(kind, "not a regular file")
            raise PolicyError(f"{path}: is {what}: only regular files are read", invalid=False)
        try:
            fd = _open_beneath(dir_fd, name, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _refusal(path, exc) from None
    finally:
        os.close(dir_fd)
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):
            raise PolicyError(f"{path}: replaced while being opened; read again", invalid=False)
        chunks, size = [], 0
        while size <= MAX_BYTES and (chunk := os.read(fd, MAX_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise _refusal(path, exc) from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise PolicyError(f"{path}: is larger than {MAX_BYTES:,} bytes, the limit for a policy")
    return decode(b"".join(chunks), str(path))
