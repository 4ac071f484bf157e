"""Tasks read and write through their scheduler's io_uring ring.

    data = rt.read(fd, 4096, offset)          # bytes (short at EOF), like os.pread
    n = rt.read_into(fd, buf, offset)         # into a writable buffer, like os.preadv
    n = rt.write(fd, b"...", offset)          # bytes written, like os.pwrite
    data = await rt.read_async(fd, 4096, offset); n = await rt.write_async(fd, data, offset)

One ring per scheduler (so one per pool worker), made by the first read or write: a
scheduler whose tasks do no I/O has none.

A request is first tried inline: it goes to the kernel in an io_uring_enter of its own,
queued, submitted and reaped in one C call (xh_rt_now), and a read or write the page cache
answers completes inside that enter, so the task gets its result without parking (one
system call, ~1.1 us here with the call; a park and a wake cost several times that, and
while 10k tasks wait for one round, all of them hold a context). A small `read` makes that
try from C (`_sched.InlineRead`) and, when it ends alone, returns its bytes with no Python
in between; whatever else happens there is finished here, as for any other request. A
preemption asked while the request is made waits for it, and is honoured by a yield when it
returns. A request that does not complete inline (a device read, an empty pipe) parks its
task, and the next EAGER_BACKOFF requests are not tried inline but batched: each is queued
in the submission queue, its task parks and other tasks run meanwhile. Everything the tasks
of a round queued goes to the kernel in one io_uring_enter, made by a pump task queued
behind the round (at the back of the class of the first task that queued a request), so a
task that keeps yielding cannot hold the requests back; that enter also reaps what the
kernel completed inside it (the page cache answers there) and wakes those tasks. While
requests stay in flight, the pump reaps again after each round of whatever tasks are
runnable; with nothing runnable the scheduler sleeps on the ring itself: a completion, the
next timer, a future completed by another thread (an eventfd polled through the ring) and,
in a pool worker, new work in its run queues all end that sleep. At most ENTRIES requests
are in the kernel at once; more wait their turn in order.

Errors: a failed request raises in its own task an OSError (`UringError`) with the
kernel's errno (EBADF for a bad fd) and the fd and offset; other tasks go on. A kernel
without io_uring, or one where `kernel.io_uring_disabled` forbids it, raises
`IoUnavailable` (an OSError: ENOSYS, EPERM) at the call, naming the reason.

A task cancelled while its request is in flight ends at once; the ring keeps the request's
buffer until the kernel is done with it, and its completion is dropped.
"""

from __future__ import annotations

import errno as _errno
import os
import threading
from array import array

from .. import _sched
from ..errors import KernelError, errno_reason
from ..io.ring import Ring, UringError, ffi, lib
from . import scheduler as _core
from .task import Cancelled

__all__ = ["IoUnavailable", "TaskRing", "read", "read_into", "ring_of", "write"]

ENTRIES = 1024  # SQ entries, and requests in flight at most (the CQ has twice as many)
SLOT = 4096  # reads up to this size go through a slot of the ring's slab
WAKE = (1 << 64) - 2  # user_data of the eventfd poll that other threads' wake-ups end
_WAKE_SIGNED = WAKE - (1 << 64)  # as the int64 array of completions holds it
FUTEX = (1 << 64) - 3  # user_data of the FUTEX_WAIT on a pool worker's run-queue word
_FUTEX_SIGNED = FUTEX - (1 << 64)
READ, WRITE = 0, 1
EAGER_BACKOFF = 64  # requests batched after one that did not complete inline
_NOT_DONE = -(1 << 63)  # xh_rt_now's result of a request still in flight (INT64_MIN)


class IoUnavailable(KernelError):
    """This kernel (or its `kernel.io_uring_disabled` setting) gives the process no io_uring."""


def _unavailable(err: OSError) -> IoUnavailable:
    why = errno_reason(err)
    try:
        with open("/proc/sys/kernel/io_uring_disabled") as f:
            disabled = f.read().strip()
    except OSError:
        disabled = None
    if err.errno == _errno.ENOSYS:
        hint = "this kernel has no io_uring (CONFIG_IO_URING off, or a filter refuses it)"
    elif disabled and disabled != "0":
        hint = f"kernel.io_uring_disabled = {disabled} forbids io_uring to this process"
    else:
        hint = "io_uring_setup was refused"
    return IoUnavailable(err.errno or _errno.ENOSYS, f"{why}: {hint}", "runtime io_uring ring")


class _Wakeup(threading.Event):
    """The scheduler's wake-up event, which also writes an eventfd that the ring polls, so
    that a sleep on the ring ends on another thread's wake-up (a completed future) too."""

    def __init__(self, efd: int):
        super().__init__()
        self.efd = efd

    def set(self) -> None:
        super().set()
        try:
            os.eventfd_write(self.efd, 1)
        except OSError:
            pass  # closed with the ring: the scheduler is gone


class TaskRing:
    """The ring of one scheduler, with its requests in flight.

    `inflight`: requests prepared and not yet completed (queued ones included);
    `enters`: io_uring_enter calls made; `ops`: completions delivered; `inline`: requests
    that completed in their own enter, without parking their task (those answered whole
    by the native fast path, `fast.reads`, included in all three).

    A request of at most SLOT bytes reads into its own slot of one slab (the slot index is
    its user_data), copied out when it is reaped: no buffer is made and pinned per read."""

    def __init__(self, sched, entries: int = ENTRIES):
        try:
            self.ring = Ring(entries)
        except OSError as exc:
            raise _unavailable(exc) from None
        self.sched = sched
        self._r = self.ring._ring
        # At most `entries` in flight: the CQ (twice as large) never overflows, with room
        # for the wake-up poll's completion.
        self.limit = self.ring.entries
        self._reqs: list = [None] * self.limit
        self._free = list(range(self.limit - 1, -1, -1))
        self._backlog: list = []  # (rec, op, fd, buffer, nbytes, offset) waiting for a slot
        self._out = array("q", bytes(16 * self.ring.cq_entries))
        self._outp = ffi.cast("int64_t *", ffi.from_buffer(self._out))
        self._res = array("q", [0])  # xh_rt_now's result of the request it tried inline
        self._resp = ffi.cast("int64_t *", ffi.from_buffer(self._res))
        # the slab, made by the first small read (its pages are touched as slots are used)
        self._slab = self._slab_p = self._slab_mv = None
        self.inflight = self.queued = 0
        self._enters = self._ops = self._inline = 0
        self._pump = None  # the pump task queued for this round, and its class
        self._eager_after = 0  # requests to queue before the next one is tried inline
        self._pump_class = None
        self._rec = None  # the request being parked on (see _register)
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._polling = False
        self._futex = None  # (address, value) of the armed FUTEX_WAIT, if one is
        self.futex_wait = bool(lib.xh_rt_futex_supported(self._r))  # Linux 6.7 and later
        addr = lambda p: int(ffi.cast("uintptr_t", p))  # noqa: E731
        self.fast = _sched.InlineRead(
            addr(ffi.addressof(lib, "xh_rt_now")),
            addr(self._r),
            addr(self._resp),
            addr(self._outp),
            self.limit,
            SLOT,
            self._free,
            self._backlog,
        )
        old = sched._wakeup
        sched._wakeup = _Wakeup(self.efd)
        if old.is_set():
            sched._wakeup.set()

    @property
    def enters(self) -> int:
        return self._enters + self.fast.reads

    @property
    def ops(self) -> int:
        return self._ops + self.fast.reads

    @property
    def inline(self) -> int:
        return self._inline + self.fast.reads

    # -- a task's request ------------------------------------------------------------------
    def request(self, op: int, fd: int, cbuf, nbytes: int, offset: int, landed=None) -> list:
        """One read or write, tried inline, else queued with the calling task parked until
        it completes (see the module's docstring). `cbuf`: what
        the kernel reads from or writes to (bytes, or cffi memory), None for a slab slot.
        `landed` (slot, others): the fast path (`fast.read`) made the inline try of this
        read into `cbuf` already, and it did not end alone (see _landed).
        Returns the request's record: [task, token, result (bytes moved or -errno), the
        bytes read into a slot, cbuf]; the record holds `cbuf` for the kernel until the
        completion, even when the task is cancelled meanwhile."""
        sched = self.sched
        task = sched.current
        if task._cancel_requested and landed is None:
            raise Cancelled()
        rec = [task, 0, None, None, cbuf]
        # Until parked, a preemption would let another task's request in halfway through
        # this one (the ring's state, self._rec): the handler's yield waits, as in
        # critical(). The park gives the CPU up, which is what a pending preemption asked;
        # a request answered inline yields for it on the way out, as critical() does.
        inline = False
        task._critical += 1
        try:
            if landed is not None:
                inline = self._landed(rec, landed[0], landed[1], cbuf, 0)
                if not inline:
                    self._eager_after = EAGER_BACKOFF
            elif self._free and not self._backlog:
                if self._eager_after <= 0:
                    inline = self._now(rec, op, fd, cbuf, nbytes, offset)
                    if not inline:
                        self._eager_after = EAGER_BACKOFF
                else:
                    self._prep(rec, op, fd, cbuf, nbytes, offset)
                    self._eager_after -= 1
            else:
                self._backlog.append((rec, op, fd, cbuf, nbytes, offset))
            if not inline:
                if self._pump is None or task.priority < self._pump_class:
                    self._pump_class = task.priority
                    self._pump = sched._spawn(self._run_pump, (), task.priority, None)
                self._rec = rec
                sched._park(self._register)
        finally:
            self._rec = None
            task._critical -= 1
            if not task._critical and not inline:
                task._preempt_requested = False
        if inline:
            self._inline += 1
            if task._preempt_requested and not task._critical:
                sched.yield_()
        return rec

    def _register(self, task, token) -> None:
        self._rec[1] = token

    def _now(self, rec, op, fd, cbuf, nbytes, offset) -> bool:
        """Queue and submit the request in one call (xh_rt_now); True when it completed
        there (its result in rec), False when it is in flight (registered as _prep does)."""
        i = self._free[-1]
        if cbuf is None:
            if self._slab is None:
                self._make_slab()
            at, ptr = i * SLOT, self._slab_p
        else:
            at, ptr = 0, cbuf
        n = lib.xh_rt_now(
            self._r, op, fd, ptr, at, nbytes, offset, i, self._resp, self._outp, self.limit
        )
        if n == -_errno.EBUSY:  # the SQ is full: the queued way submits it first
            self._prep(rec, op, fd, cbuf, nbytes, offset)
            return False
        return self._landed(rec, i, n, cbuf, at)

    def _landed(self, rec, i: int, n: int, cbuf, at: int) -> bool:
        """Request i (slot i's bytes at `at` when `cbuf` is None) was tried inline, by _now
        or by the fast path: True with its result in rec when it completed in its enter,
        else False with it registered in flight; the n other completions found are reaped."""
        self._free.pop()
        self._enters += 1
        self.queued = 0
        res = self._res[0]
        if res != _NOT_DONE:
            self._free.append(i)
            self._ops += 1
            rec[2] = res
            if cbuf is None and res > 0:
                rec[3] = self._slab_mv[at : at + res].tobytes()
        else:
            self._reqs[i] = rec
            self.inflight += 1
        if n < 0:
            raise UringError.from_res(n, "io_uring_enter (runtime ring)")
        if n:
            self._reap(n)
        return res != _NOT_DONE

    def _make_slab(self) -> None:
        self._slab = bytearray(self.limit * SLOT)
        self._slab_p = ffi.from_buffer(self._slab)
        self._slab_mv = memoryview(self._slab)

    def _prep(self, rec, op, fd, cbuf, nbytes, offset) -> None:
        i = self._free.pop()
        if cbuf is None:
            if self._slab is None:
                self._make_slab()
            cbuf, at = self._slab_p, i * SLOT
        else:
            at = 0
        if lib.xh_rt_prep(self._r, op, fd, cbuf, at, nbytes, offset, i) < 0:
            # The SQ is full (only our poll and futex entries could fill it beyond the
            # requests in flight): what is queued goes now.
            self._enter(0)
            if lib.xh_rt_prep(self._r, op, fd, cbuf, at, nbytes, offset, i) < 0:
                self._free.append(i)
                raise UringError(_errno.EBUSY, "submission queue full", "runtime ring")
        self._reqs[i] = rec
        self.inflight += 1
        self.queued += 1

    # -- entering the kernel ---------------------------------------------------------------
    def _enter(self, wait_ns: int) -> int:
        """Submit what is queued, wait up to wait_ns (0: not at all, -1: no limit) when
        nothing is ready, wake the tasks whose requests completed; how many did."""
        n = lib.xh_rt_enter(self._r, wait_ns, self._outp, self.limit)
        self._enters += 1
        self.queued = 0
        if n < 0:
            raise UringError.from_res(n, "io_uring_enter (runtime ring)")
        return self._reap(n) if n else 0

    def _reap(self, n: int) -> int:
        """Deliver the n completions xh_rt_enter or xh_rt_now left in the out array."""
        if n:
            out, reqs, free, wake = self._out, self._reqs, self._free, self.sched._wake
            got = 0
            for k in range(0, 2 * n, 2):
                i = out[k]
                if i < 0:  # ours, not a request's: re-armed at the next sleep
                    if i == _WAKE_SIGNED:
                        self._polling = False
                        try:
                            os.eventfd_read(self.efd)
                        except BlockingIOError:
                            pass
                    elif i == _FUTEX_SIGNED:
                        self._futex = None
                    continue
                rec = reqs[i]
                reqs[i] = None
                free.append(i)
                res = rec[2] = out[k + 1]
                if rec[4] is None and res > 0:  # a slot's bytes, out before it is reused
                    at = i * SLOT
                    rec[3] = self._slab_mv[at : at + res].tobytes()
                if rec[1]:  # token 0: completed inline, its task is not parked
                    wake(rec[0], rec[1])  # a stale token (a cancelled task) does nothing
                got += 1
            self.inflight -= got
            self._ops += got
            if self._backlog:
                self._admit()
            return got
        return 0

    def _admit(self) -> None:
        backlog, self._backlog = self._backlog, []
        for k, args in enumerate(backlog):
            if not self._free:
                self._backlog = backlog[k:]
                return
            self._prep(*args)

    def _run_pump(self) -> None:
        """The round's end: one enter for everything queued. While requests stay in flight
        it comes back after each round of the runnable tasks to reap, in their class when
        only less urgent ones are runnable (a task that keeps yielding in a low class must
        not hold completions back from a higher one); with nothing runnable it ends, and
        the scheduler's sleep on the ring reaps."""
        sched = self.sched
        me = sched.current
        while self._pump is me:  # a more urgent pump spawned meanwhile takes over
            self._enter(0)
            if not self.inflight:
                break
            runnable = sched.runnable_class()
            if runnable is None:
                break
            if runnable <= me.priority:
                sched.yield_()
                continue
            self._pump_class = runnable
            self._pump = sched._spawn(self._run_pump, (), runnable, None)
            return
        if self._pump is me:
            self._pump = None

    # -- sleeping ----------------------------------------------------------------------------
    def poll(self) -> int:
        """Submit what is queued and reap what is ready, without waiting; tasks woken."""
        return self._enter(0)

    def sleep(self, timeout: float | None, futex: tuple[int, int] | None = None) -> int:
        """Nothing is runnable: wait on the ring for a completion, for `timeout` seconds at
        most (None: no limit) or until another thread's wake-up; completions reaped.
        `futex` (address, value): a shared futex word whose FUTEX_WAKE ends the sleep too
        (only where `futex_wait`); its wait stays armed across sleeps until it fires."""
        if not self._polling:
            if lib.xh_rt_poll(self._r, self.efd, WAKE) == 0:
                self._polling = True
        if futex is not None and self._futex is None:
            # An armed wait on the same word stays valid: its value can only have moved
            # by a wake, which completes it.
            if lib.xh_rt_futex_wait(self._r, futex[0], futex[1], FUTEX) == 0:
                self._futex = futex
        if self.sched._wakeup.is_set():
            return self._enter(0)
        return self._enter(-1 if timeout is None else max(1, int(timeout * 1e9)))

    def close(self) -> None:
        """Cancel what is in flight (waiting for the kernel to let go of the buffers)."""
        if not self.ring.closed:
            self.fast.close()
            self.ring.pending = self.inflight + self._polling + (self._futex is not None)
            self.ring.close()
            wakeup = threading.Event()  # the eventfd's number may be reused once closed
            if self.sched._wakeup.is_set():
                wakeup.set()
            self.sched._wakeup = wakeup
            os.close(self.efd)
            self._reqs = []


def ring_of(sched) -> TaskRing:
    """The scheduler's ring, made on first use."""
    ring = sched._io
    if ring is None:
        ring = sched._io = TaskRing(sched)
    return ring


def _ring() -> TaskRing:
    sched = _core._running
    if sched is None or sched.current is None or threading.get_ident() != sched._thread:
        raise RuntimeError("runtime read/write is called only inside a task")
    ring = sched._io
    return ring if ring is not None else ring_of(sched)


def _fail(res: int, what: str, fd: int, offset: int) -> UringError:
    return UringError.from_res(res, f"{what} fd {fd} @ {offset}")


def read(fd: int, nbytes: int, offset: int = 0) -> bytes:
    """Up to `nbytes` at `offset` of `fd` (fewer at EOF), through the scheduler's ring; the
    task parks meanwhile. OSError (UringError) with the kernel's errno on failure."""
    sched = _core._running
    if sched is not None:
        ring = sched._io
        if ring is not None and ring._eager_after <= 0:
            got = ring.fast.read(fd, nbytes, offset)
            if type(got) is bytes:
                return got
            if got is not None:  # tried, and not ended alone: finished as any request
                i, n, data = got
                res = ring.request(READ, fd, data, nbytes, offset, (i, n))[2]
                if res < 0:
                    raise _fail(res, "read", fd, offset)
                return data if res == nbytes else data[:res]
    if nbytes <= SLOT:
        if nbytes < 0 or offset < 0:
            raise ValueError(f"read: nbytes {nbytes} and offset {offset} must be >= 0")
        rec = _ring().request(READ, fd, None, nbytes, offset)
        res = rec[2]
        if res < 0:
            raise _fail(res, "read", fd, offset)
        return rec[3] or b""
    if offset < 0:
        raise ValueError(f"read: offset {offset} must be >= 0")
    buf = bytearray(nbytes)
    res = _ring().request(READ, fd, ffi.from_buffer(buf), nbytes, offset)[2]
    if res < 0:
        raise _fail(res, "read", fd, offset)
    return bytes(buf) if res == nbytes else bytes(memoryview(buf)[:res])


def read_into(fd: int, buf, offset: int = 0) -> int:
    """Read into `buf` (any writable bytes-like: bytearray, memoryview slice, mmap) at
    `offset` of `fd`, as os.preadv would; bytes read. The kernel writes into `buf` itself:
    no bytes object is made, which matters when many reads are alive at once."""
    if offset < 0:
        raise ValueError(f"read_into: offset {offset} must be >= 0")
    cbuf = ffi.from_buffer(buf, require_writable=True)
    res = _ring().request(READ, fd, cbuf, len(cbuf), offset)[2]
    if res < 0:
        raise _fail(res, "read", fd, offset)
    return res


def write(fd: int, data, offset: int = 0) -> int:
    """Write `data` (any bytes-like) at `offset` of `fd` through the scheduler's ring; bytes
    written (short only as pwrite would be)."""
    if offset < 0:
        raise ValueError(f"write: offset {offset} must be >= 0")
    if type(data) is bytes:
        cbuf, nbytes = data, len(data)  # passed to C as it is, kept alive by the request
    else:
        view = memoryview(data)
        cbuf, nbytes = ffi.from_buffer(view), view.nbytes
    res = _ring().request(WRITE, fd, cbuf, nbytes, offset)[2]
    if res < 0:
        raise _fail(res, "write", fd, offset)
    return res
