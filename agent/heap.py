"""The C heap of this process (glibc malloc): when freed memory goes back to the kernel.

    heap.trim()         give free heap pages back now (the daemon after a burst, an idle
                        pool worker)
    heap.keep_freed()   never give them back on free(), only at trim(): memory freed by one
                        burst of allocations serves the next without a page fault per page

glibc returns the top of the heap to the kernel on free() once more than M_TRIM_THRESHOLD
(128 KiB) is free there, so a process that allocates and frees tens of MiB again and again
(10k tasks' 4 KiB results) takes a page fault per page each time: about 2 us a task in
`xhagent bench pool`'s I/O case. Elsewhere than glibc both are no-ops.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # mallopt's parameter (malloc.h)
_NEVER = 2**31 - 1  # the largest threshold mallopt takes: no trim on free() in practice

_libc = None


def _lib():
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(None)
            lib.malloc_trim.argtypes = [ctypes.c_size_t]
            lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            _libc = lib
        except (OSError, AttributeError):
            _libc = False
    return _libc


def trim() -> None:
    """Return the free heap pages to the kernel (malloc_trim(0))."""
    lib = _lib()
    if lib:
        lib.malloc_trim(0)


def keep_freed() -> bool:
    """Keep freed heap memory until trim(); False where the allocator has no such knob."""
    lib = _lib()
    return bool(lib and lib.mallopt(M_TRIM_THRESHOLD, _NEVER))
