"""Text for failed kernel calls: `-EOPNOTSUPP (Operation not supported)`, the one format
every report, CLI message and OSError subclass of the agent uses for an errno.

Ground floor: imports nothing of the agent's packages, so any of them may import it.
"""

from __future__ import annotations

import errno
import os

__all__ = ["KernelError", "errno_name", "errno_reason"]


def errno_name(code: int) -> str:
    """`EPERM` for 1 (or -1); the number itself for a code Python has no name for."""
    code = abs(code)
    # errorcode maps 95 to ENOTSUP; io_uring and the kernel's own texts say EOPNOTSUPP.
    return "EOPNOTSUPP" if code == errno.EOPNOTSUPP else errno.errorcode.get(code, str(code))


def errno_reason(
    err: OSError | int, what: str = "", *, name: str | None = None, text: str | None = None
) -> str:
    """`-EOPNOTSUPP (Operation not supported)` for an OSError or an errno (either sign),
    prefixed with `what: ` when given. A library with codes of its own beyond the errno
    range (libbpf's 4000s) passes their `name` and `text`."""
    code = abs(err.errno or 0) if isinstance(err, OSError) else abs(err)
    reason = f"-{name or errno_name(code)} ({text or os.strerror(code)})"
    return f"{what}: {reason}" if what else reason


class KernelError(OSError):
    """Base of the agent's OSErrors (cgroup, io_uring, BPF): `errno` is the kernel's, and
    `str()` is the message as the agent words it, `FILENAME: STRERROR` (or the message
    alone), without Python's `[Errno N]` prefix and quotes."""

    @classmethod
    def from_errno(cls, code: int, what: str, **kw) -> KernelError:
        """`what: -ENAME (text)` for a kernel return value or errno of either sign."""
        return cls(abs(code), errno_reason(code, **kw), what)

    def __str__(self) -> str:
        if self.strerror is None:
            return super().__str__()
        return f"{self.filename}: {self.strerror}" if self.filename else self.strerror
