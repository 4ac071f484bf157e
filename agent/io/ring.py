"""A `Ring`: one io_uring instance with its setup flags, probe, registrations and a
synchronous submit-and-reap path.

Completions are reaped in bulk through `xh_reap` (C); a negative `res` becomes an
`UringError` carrying the errno and the path or operation it belongs to.
"""
from __future__ import annotations

import errno as _errno
import os
from contextlib import contextmanager
from typing import Iterator

from .. import _uring

ffi, lib = _uring.ffi, _uring.lib
PAGE = os.sysconf("SC_PAGE_SIZE")

OPCODES = [n[len("IORING_OP_"):] for n in dir(lib) if n.startswith("IORING_OP_") and n != "IORING_OP_LAST"]
SETUP_FLAGS = {n[len("IORING_SETUP_"):].lower(): getattr(lib, n) for n in dir(lib) if n.startswith("IORING_SETUP_")}


class UringError(OSError):
    """An io_uring call or completion failed; `errno` is the kernel's, `filename` what it was on."""

    @classmethod
    def from_res(cls, res: int, what: str) -> "UringError":
        code = -res if res < 0 else res
        return cls(code, os.strerror(code), what)


def _check(res: int, what: str) -> int:
    if res < 0:
        raise UringError.from_res(res, what)
    return res


@contextmanager
def aligned_buffer(size: int, alignment: int = PAGE) -> Iterator[memoryview]:
    """A zeroed buffer aligned for O_DIRECT, freed on exit; yields a writable memoryview."""
    ptr = lib.xh_aligned_alloc(alignment, size)
    if ptr == ffi.NULL:
        raise MemoryError(f"aligned_alloc({alignment}, {size})")
    view = memoryview(ffi.buffer(ptr, size))
    try:
        yield view
    finally:
        # Release before freeing: a view that outlives the memory (say, in a traceback
        # frame) must be a dead view, not a dangling pointer.
        view.release()
        lib.xh_aligned_free(ptr)


def _flags(names: tuple[str, ...] | list[str]) -> int:
    value = 0
    for name in names:
        try:
            value |= SETUP_FLAGS[name.lower()]
        except KeyError:
            raise ValueError(f"unknown io_uring setup flag {name!r}; known: {', '.join(sorted(SETUP_FLAGS))}")
    return value


class Ring:
    """An io_uring instance. `flags` are setup flag names such as ("sqpoll",) or ("iopoll",)."""

    def __init__(self, entries: int = 64, flags: tuple[str, ...] = (), sq_thread_cpu: int | None = None,
                 sq_thread_idle_ms: int | None = None):
        self._open = False
        self.flag_names = tuple(f.lower() for f in flags)
        self._ring = ffi.new("struct io_uring *")
        params = ffi.new("struct io_uring_params *")
        params.flags = _flags(self.flag_names)
        if sq_thread_cpu is not None:
            params.flags |= lib.IORING_SETUP_SQ_AFF
            params.sq_thread_cpu = sq_thread_cpu
        if sq_thread_idle_ms is not None:
            params.sq_thread_idle = sq_thread_idle_ms
        _check(lib.io_uring_queue_init_params(entries, self._ring, params), f"io_uring_setup({entries}, {self.flag_names})")
        self.entries = params.sq_entries
        self.features = params.features
        self._open = True
        self._reap_data = ffi.new("uint64_t[]", params.cq_entries)
        self._reap_res = ffi.new("int32_t[]", params.cq_entries)

    # -- lifetime -------------------------------------------------------------------
    def close(self) -> None:
        if self._open:
            self._open = False
            lib.io_uring_queue_exit(self._ring)

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def fd(self) -> int:
        return self._ring.ring_fd

    # -- submission -----------------------------------------------------------------
    def sqe(self):
        sqe = lib.io_uring_get_sqe(self._ring)
        if sqe == ffi.NULL:
            # Ring full: push what is queued to the kernel and retry once.
            _check(lib.io_uring_submit(self._ring), "io_uring_submit")
            sqe = lib.io_uring_get_sqe(self._ring)
            if sqe == ffi.NULL:
                raise UringError(_errno.EBUSY, "submission queue full", "io_uring_get_sqe")
        return sqe

    def submit_and_wait(self, wait_nr: int) -> int:
        return _check(lib.io_uring_submit_and_wait(self._ring, wait_nr), "io_uring_submit_and_wait")

    def reap(self) -> list[tuple[int, int]]:
        """Every completion that is ready, as (user_data, res), with their CQ slots released."""
        n = lib.xh_reap(self._ring, self._reap_data, self._reap_res, len(self._reap_res))
        return [(self._reap_data[i], self._reap_res[i]) for i in range(n)]

    def run(self, count: int) -> list[tuple[int, int]]:
        """Submit what is queued and wait for `count` completions."""
        done: list[tuple[int, int]] = []
        while len(done) < count:
            self.submit_and_wait(count - len(done))
            done.extend(self.reap())
        return done

    # -- registrations --------------------------------------------------------------
    def register_buffers(self, buffers: list[memoryview]) -> None:
        iov = ffi.new("struct iovec[]", len(buffers))
        for i, buf in enumerate(buffers):
            # The kernel pins the pages; the caller keeps `buf` alive while registered.
            with ffi.from_buffer(buf) as ptr:
                iov[i].iov_base = ptr
            iov[i].iov_len = len(buf)
        _check(lib.io_uring_register_buffers(self._ring, iov, len(buffers)), "io_uring_register_buffers")

    def unregister_buffers(self) -> None:
        _check(lib.io_uring_unregister_buffers(self._ring), "io_uring_unregister_buffers")

    def register_files(self, fds: list[int]) -> None:
        _check(lib.io_uring_register_files(self._ring, ffi.new("int[]", fds), len(fds)), "io_uring_register_files")

    def unregister_files(self) -> None:
        _check(lib.io_uring_unregister_files(self._ring), "io_uring_unregister_files")

    def register_eventfd(self, efd: int) -> None:
        _check(lib.io_uring_register_eventfd(self._ring, efd), "io_uring_register_eventfd")

    # -- one-shot operations --------------------------------------------------------
    def nop(self) -> int:
        lib.io_uring_prep_nop(self.sqe())
        return self.run(1)[0][1]

    def read_into(self, fd: int, buf: memoryview, offset: int, *, fixed_index: int | None = None,
                  fixed_file: bool = False, what: str = "read") -> int:
        """Read into `buf` at `offset`; returns the byte count. `fixed_index` uses a registered
        buffer (read_fixed), `fixed_file` treats `fd` as an index into the registered files."""
        sqe = self.sqe()
        with ffi.from_buffer(buf) as ptr:
            if fixed_index is None:
                lib.io_uring_prep_read(sqe, fd, ptr, len(buf), offset)
            else:
                lib.io_uring_prep_read_fixed(sqe, fd, ptr, len(buf), offset, fixed_index)
            if fixed_file:
                lib.io_uring_sqe_set_flags(sqe, lib.IOSQE_FIXED_FILE)
            res = self.run(1)[0][1]
        return _check(res, what)

    def supported_ops(self) -> list[str]:
        return _probe_names(lib.io_uring_get_probe_ring(self._ring))


def _probe_names(probe) -> list[str]:
    if probe == ffi.NULL:
        raise UringError(_errno.EOPNOTSUPP, "io_uring probe not supported", "io_uring_register(PROBE)")
    try:
        return sorted(n for n in OPCODES if lib.io_uring_opcode_supported(probe, getattr(lib, f"IORING_OP_{n}")))
    finally:
        lib.io_uring_free_probe(probe)


def supported_ops() -> list[str]:
    """Opcode names this kernel accepts (IORING_REGISTER_PROBE on a throwaway ring)."""
    return _probe_names(lib.io_uring_get_probe())
