"""A task's output files as Logs reads them: only the files the agent's shim wrote.

The run directory (STATE/tasks/ID/ATTEMPT) is the agent's, but a workload's user may be
able to write in it (a root workload; a `cwd` or a mode an operator loosened), and Logs runs
as the agent: a `stdout` replaced by a symbolic link or a hard link to /etc/shadow would be
streamed to a caller who could not read that file. So the directory is opened
O_DIRECTORY|O_NOFOLLOW, the file O_NOFOLLOW|O_NONBLOCK relative to it, and it is read only
when it is a regular file that the agent's own uid owns and that has one name. That is what
the shim leaves: it runs as the agent and creates the file O_CREAT|O_NOFOLLOW. A workload of
another user cannot make a file the agent owns, and a hard link to someone else's file has
two names; a workload of the agent's own user can already read what the agent can.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path


class OutputRefused(Exception):
    """The output file is not one the agent wrote; str() says what it is instead."""


def _refuse(path: Path, what: str) -> OutputRefused:
    return OutputRefused(f"{path}: {what}, not the file the agent wrote: not read")


def read_output(run_dir: Path, name: str, offset: int, size: int) -> bytes:
    """Up to `size` bytes of `run_dir/name` from `offset`; b"" while it does not exist yet
    (the shim makes it at its stream's first byte)."""
    fd = _open_output(run_dir, name)
    if fd is None:
        return b""
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


TAIL_BLOCK = 64 << 10


def tail_offset(run_dir: Path, name: str, lines: int) -> int:
    """Where the last `lines` lines of `run_dir/name` begin (a last line without its
    newline counts as one); 0 while it does not exist yet. Read backwards a block at a time,
    so a short tail of a long file reads one block."""
    fd = _open_output(run_dir, name)
    if fd is None:
        return 0
    try:
        end = os.fstat(fd).st_size
        if lines == 0 or end == 0:
            return end
        if os.pread(fd, 1, end - 1) == b"\n":
            end -= 1  # the last line's own newline starts no line after it
        found, pos = 0, end
        while pos > 0:
            start = max(0, pos - TAIL_BLOCK)
            block = os.pread(fd, pos - start, start)
            cut = len(block)
            while (cut := block.rfind(b"\n", 0, cut)) >= 0:
                found += 1
                if found == lines:
                    return start + cut + 1
            pos = start
        return 0
    finally:
        os.close(fd)


MARK = struct.Struct("<QQ")  # the shim's time index: CLOCK_REALTIME ns, offset
MARKS_MAX = 65536  # the shim's TIMES_MAX: what is read of an index at most
SECOND = 1_000_000_000


def since_offset(run_dir: Path, name: str, since_ns: int) -> int:
    """Where the output of `run_dir/name` written at or after `since_ns` (CLOCK_REALTIME)
    begins, from the shim's marks in NAME.times: a mark before the first byte of each second
    of output. Bytes with no mark of their own were written in the second of the mark before
    them, so output of since_ns's own second may be included (whole seconds' precision), and
    a stream with no index (or whose marks stopped) starts earlier than asked, never later.
    0 while the stream does not exist yet."""
    fd = _open_output(run_dir, name)
    if fd is None:
        return 0
    try:
        end = os.fstat(fd).st_size  # before the marks: every byte up to here has its mark
    finally:
        os.close(fd)
    fd = _open_output(run_dir, f"{name}.times")
    if fd is None:
        return 0
    try:
        size = min(os.fstat(fd).st_size // MARK.size, MARKS_MAX) * MARK.size  # torn: no mark
        marks = list(MARK.iter_unpack(os.pread(fd, size, 0)))
    finally:
        os.close(fd)
    return offset_since(marks, end, since_ns)


def offset_since(marks: list[tuple[int, int]], end: int, since_ns: int) -> int:
    """since_offset's rule on the marks (ns, offset) of a stream `end` bytes long."""
    before = [i for i, (ns, _) in enumerate(marks) if ns <= since_ns]
    if not before:
        return 0  # every byte came at or after the first mark, itself after since_ns
    i = before[-1]
    if marks[i][0] // SECOND == since_ns // SECOND:
        return min(marks[i][1], end)  # since_ns's own second: all of it
    # what follows mark i up to the next mark came in mark i's second, before since_ns
    return min(marks[i + 1][1], end) if i + 1 < len(marks) else end


def _open_output(run_dir: Path, name: str) -> int | None:
    """An fd of `run_dir/name` when it is the file the shim wrote (the module's docstring);
    None while it does not exist yet; OutputRefused for anything else."""
    path = run_dir / name
    try:
        dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refuse(run_dir, "the run directory is not a directory (a link?)") from None
        raise OutputRefused(f"{run_dir}: cannot be read: {exc.strerror}") from None
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "a symbolic link") from None
        raise OutputRefused(f"{path}: cannot be read: {exc.strerror}") from None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, "not a regular file")
        if st.st_uid != os.geteuid():
            raise _refuse(path, f"owned by uid {st.st_uid}")
        if st.st_nlink != 1:
            raise _refuse(path, f"a file with {st.st_nlink} names (a hard link)")
    except BaseException:
        os.close(fd)
        raise
    return fd
