"""A `Ring`: one io_uring instance with its setup flags, probe, registrations and a
synchronous submit-and-reap path.

Completions are reaped in bulk through `xh_reap` (C); a negative `res` becomes an
`UringError` carrying the errno and the path or operation it belongs to.
"""

from __future__ import annotations

import errno as _errno

from .. import _uring
from ..errors import KernelError
from .buffers import PAGE, aligned_buffer  # noqa: F401  (re-exported: ring.aligned_buffer)

ffi, lib = _uring.ffi, _uring.lib
CANCEL_USER_DATA = (1 << 64) - 1  # the close-time cancel request's own completion

OPCODES = [
    n[len("IORING_OP_") :] for n in dir(lib) if n.startswith("IORING_OP_") and n != "IORING_OP_LAST"
]
SETUP_FLAGS = {
    n[len("IORING_SETUP_") :].lower(): getattr(lib, n)
    for n in dir(lib)
    if n.startswith("IORING_SETUP_")
}


class UringError(KernelError):
    """An io_uring call or completion failed; `errno` is the kernel's, `filename` what it was on."""

    @classmethod
    def from_res(cls, res: int, what: str) -> UringError:
        return cls.from_errno(res, what)


def _check(res: int, what: str) -> int:
    if res < 0:
        raise UringError.from_res(res, what)
    return res


def _flags(names: tuple[str, ...] | list[str]) -> int:
    value = 0
    for name in names:
        try:
            value |= SETUP_FLAGS[name.lower()]
        except KeyError:
            raise ValueError(
                f"unknown io_uring setup flag {name!r}; known: {', '.join(sorted(SETUP_FLAGS))}"
            ) from None
    return value


class Ring:
    """An io_uring instance. `flags` are setup flag names such as ("sqpoll",) or ("iopoll",)."""

    def __init__(
        self,
        entries: int = 64,
        flags: tuple[str, ...] = (),
        sq_thread_cpu: int | None = None,
        sq_thread_idle_ms: int | None = None,
    ):
        self._open = False
        self.pending = 0  # SQEs handed out whose completions are not reaped yet
        self.flag_names = tuple(f.lower() for f in flags)
        self._ring = ffi.new("struct io_uring *")
        params = ffi.new("struct io_uring_params *")
        params.flags = _flags(self.flag_names)
        if sq_thread_cpu is not None:
            params.flags |= lib.IORING_SETUP_SQ_AFF
            params.sq_thread_cpu = sq_thread_cpu
        if sq_thread_idle_ms is not None:
            params.sq_thread_idle = sq_thread_idle_ms
        _check(
            lib.io_uring_queue_init_params(entries, self._ring, params),
            f"io_uring_setup({entries}, {self.flag_names})",
        )
        self.entries = params.sq_entries
        self.cq_entries = params.cq_entries
        self.features = params.features
        self._open = True
        self.files: list[int] | None = None  # registered files, by index
        self.buffers: list[tuple[int, int]] | None = (
            None  # registered buffers: (address, bytes), by index
        )
        self._reap_data = ffi.new("uint64_t[]", params.cq_entries)
        self._reap_res = ffi.new("int32_t[]", params.cq_entries)

    # -- lifetime -------------------------------------------------------------------
    def close(self) -> None:
        """Cancel what is in flight and wait for it, so no buffer is freed under the kernel."""
        if self._open:
            if self.pending:
                self.cancel_all()
            self._open = False
            lib.io_uring_queue_exit(self._ring)

    @property
    def closed(self) -> bool:
        return not self._open

    def cancel_all(self, quiet_s: float = 1.0) -> list[tuple[int, int]]:
        """Cancel every request in flight and reap until none is left; returns their completions.

        A read already running in the kernel (io-wq) cannot be cancelled: it is waited for.
        `pending` counts SQEs from sqe()/prep_*() minus completions seen by reap(); a caller that
        consumed CQEs itself leaves it too high, so a quiet `quiet_s` ends the wait.
        """
        done: list[tuple[int, int]] = []
        sqe = self.sqe()
        lib.io_uring_prep_cancel64(sqe, 0, lib.IORING_ASYNC_CANCEL_ANY)
        lib.io_uring_sqe_set_data64(sqe, CANCEL_USER_DATA)
        self.submit()
        cqe = ffi.new("struct io_uring_cqe **")
        ts = ffi.new(
            "struct __kernel_timespec *",
            {"tv_sec": int(quiet_s), "tv_nsec": int(quiet_s % 1 * 1e9)},
        )
        while self.pending > 0:
            if lib.io_uring_wait_cqe_timeout(self._ring, cqe, ts) < 0:
                break
            done.extend(c for c in self.reap() if c[0] != CANCEL_USER_DATA)
        self.pending = 0
        return done

    def __enter__(self) -> Ring:
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
        self.pending += 1
        return sqe

    def prep_rw(
        self,
        write: bool,
        fd: int,
        ptr,
        length: int,
        offset: int,
        user_data: int,
        sqe_flags: int = 0,
    ) -> bool:
        """Queue one read/write without submitting; False when the SQ is full."""
        if (
            lib.xh_prep_rw(
                self._ring,
                lib.XH_OP_WRITE if write else lib.XH_OP_READ,
                fd,
                ptr,
                length,
                offset,
                user_data,
                sqe_flags,
            )
            < 0
        ):
            return False
        self.pending += 1
        return True

    def prep_file_chain(self, path_c, slot: int, ptr, length: int, user_data_base: int) -> bool:
        """Queue openat -> read -> close of `path_c` through fixed slot `slot`; False when the SQ
        lacks three free entries. Completions carry user_data_base | 1, | 2, | 3."""
        if lib.xh_prep_file_chain(self._ring, path_c, slot, ptr, length, user_data_base) < 0:
            return False
        self.pending += 3
        return True

    def submit(self) -> int:
        return _check(lib.io_uring_submit(self._ring), "io_uring_submit")

    def submit_and_wait(self, wait_nr: int) -> int:
        return _check(lib.io_uring_submit_and_wait(self._ring, wait_nr), "io_uring_submit_and_wait")

    def reap(self) -> list[tuple[int, int]]:
        """Every completion that is ready, as (user_data, res), with their CQ slots released."""
        n = lib.xh_reap(self._ring, self._reap_data, self._reap_res, len(self._reap_res))
        self.pending -= n
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
        spans = []
        for i, buf in enumerate(buffers):
            # The kernel pins the pages; the caller keeps `buf` alive while registered.
            with ffi.from_buffer(buf) as ptr:
                iov[i].iov_base = ptr
                spans.append((int(ffi.cast("uintptr_t", ptr)), memoryview(buf).nbytes))
            iov[i].iov_len = spans[-1][1]
        _check(
            lib.io_uring_register_buffers(self._ring, iov, len(buffers)),
            "io_uring_register_buffers",
        )
        self.buffers = spans

    def unregister_buffers(self) -> None:
        _check(lib.io_uring_unregister_buffers(self._ring), "io_uring_unregister_buffers")
        self.buffers = None

    def buffer_index(self, buf, nbytes: int | None = None) -> int | None:
        """The registered buffer holding the first `nbytes` (default: all) of `buf`, or None."""
        if not self.buffers:
            return None
        with ffi.from_buffer(buf) as ptr:
            start = int(ffi.cast("uintptr_t", ptr))
        end = start + (memoryview(buf).nbytes if nbytes is None else nbytes)
        return next(
            (i for i, (a, n) in enumerate(self.buffers) if a <= start and end <= a + n), None
        )

    def register_files(self, fds: list[int]) -> None:
        _check(
            lib.io_uring_register_files(self._ring, ffi.new("int[]", fds), len(fds)),
            "io_uring_register_files",
        )
        self.files = list(fds)

    def unregister_files(self) -> None:
        _check(lib.io_uring_unregister_files(self._ring), "io_uring_unregister_files")
        self.files = None

    def register_eventfd(self, efd: int) -> None:
        _check(lib.io_uring_register_eventfd(self._ring, efd), "io_uring_register_eventfd")

    # -- one-shot operations --------------------------------------------------------
    def nop(self) -> int:
        lib.io_uring_prep_nop(self.sqe())
        return self.run(1)[0][1]

    def read_into(
        self,
        fd: int,
        buf: memoryview,
        offset: int,
        *,
        fixed_index: int | None = None,
        fixed_file: bool = False,
        what: str = "read",
    ) -> int:
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
        raise UringError(
            _errno.EOPNOTSUPP, "io_uring probe not supported", "io_uring_register(PROBE)"
        )
    try:
        return sorted(
            n
            for n in OPCODES
            if lib.io_uring_opcode_supported(probe, getattr(lib, f"IORING_OP_{n}"))
        )
    finally:
        lib.io_uring_free_probe(probe)


def supported_ops() -> list[str]:
    """Opcode names this kernel accepts (IORING_REGISTER_PROBE on a throwaway ring)."""
    return _probe_names(lib.io_uring_get_probe())
