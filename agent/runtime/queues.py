"""The worker pool's run queues in shared memory: a local ring per worker, one global ring
that any process may push to, and steal-half between workers.

The C in native/runq.c does the work (its opening comment gives the algorithms and the
memory-ordering argument); this is the bytes-in, bytes-out surface. A payload is copied
once into a fixed-size slot of the region and once out of it; pickling is the pool's
business. Only a worker's owner (one thread of one process) may call `push_local(w)` and
`steal(w, victim)`, which write w's tail; pops, `push_global`, `wait` and `wake` are for
any process that holds the region: its creator, or whoever attaches to its fd (inherited
across fork, or passed with `pass_fds`) or its path. One object serves one thread at a
time (pops share a buffer); another thread attaches its own.
"""

from __future__ import annotations

import errno
import os

from xhagent._runq import ffi, lib


class QueueCorrupt(RuntimeError):
    """An entry named a slot that had been freed: a task was lost or taken twice."""


class SharedQueues:
    def __init__(self, handle, fd: int, path: str | None):
        self._q, self.fd, self._path = handle, fd, path
        params = ffi.new("uint32_t[4]")
        lib.rq_params(handle, params)
        self.workers, self.ring_size, self.slots, self.slot_size = params
        self._buf = ffi.new("char[]", self.slot_size)
        self._word = ffi.new("uint64_t *"), ffi.new("uint32_t *")

    @classmethod
    def create(
        cls,
        workers: int,
        ring_size: int = 4096,
        slots: int | None = None,
        slot_size: int = 1024,
        *,
        path: str | os.PathLike | None = None,
    ) -> SharedQueues:
        """A new region: in a memfd, or in a new file at `path` (such as under /dev/shm).

        `slots` (payloads in flight at once) defaults to enough to fill every ring, up to
        65536; a payload longer than `slot_size` bytes is refused with ValueError."""
        if slots is None:
            slots = min((workers + 1) * ring_size, 65536)
        if not lib.rq_region_size(workers, ring_size, slots, slot_size):
            raise ValueError(
                f"run queues: workers={workers} (1..4096), ring_size={ring_size} (a power of"
                f" two, 2..2^24), slots={slots} (1..2^24-2), slot_size={slot_size} (1..2^24)"
            )
        if path is None:
            fd = os.memfd_create("xhagent-runq")
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        err = ffi.new("int *")
        handle = lib.rq_create(fd, workers, ring_size, slots, slot_size, err)
        if handle == ffi.NULL and path is not None:
            os.unlink(path)  # ours, just made; on success the creator removes it when done
        return cls._wrap(handle, err, fd, path)

    @classmethod
    def attach(cls, fd_or_path: int | str | os.PathLike) -> SharedQueues:
        """The region another process created, by its fd (kept open by the caller: this
        object works on a duplicate) or by its path."""
        if isinstance(fd_or_path, int):
            fd, path = os.dup(fd_or_path), None
        else:
            fd, path = os.open(fd_or_path, os.O_RDWR | os.O_CLOEXEC), fd_or_path
        err = ffi.new("int *")
        return cls._wrap(lib.rq_attach(fd, err), err, fd, path)

    @classmethod
    def _wrap(cls, handle, err, fd: int, path) -> SharedQueues:
        if handle == ffi.NULL:
            os.close(fd)
            if err[0] == errno.EPROTO:  # runq.c's word for "not one of our regions"
                raise ValueError(f"{path or 'fd'}: not an xhagent run-queue region")
            raise OSError(err[0], os.strerror(err[0]), path)
        return cls(handle, fd, path)

    @property
    def path(self) -> str:
        """A path another process can attach to (the memfd's /proc entry when no file)."""
        return os.fspath(self._path) if self._path else f"/proc/{os.getpid()}/fd/{self.fd}"

    def _check(self, payload: bytes) -> None:
        if len(payload) > self.slot_size:
            raise ValueError(
                f"run queues: a payload of {len(payload)} bytes does not fit a slot of"
                f" {self.slot_size}; create the queues with a larger slot_size"
            )

    def _popped(self, n: int) -> bytes | None:
        if n >= 0:
            return ffi.buffer(self._buf, n)[:]
        if n == lib.RQ_EMPTY:
            return None
        raise QueueCorrupt("run queues: an entry names a freed slot (a task lost or doubled)")

    def push_local(self, worker: int, payload: bytes) -> bool:
        """False when the ring or the slots are full. Owner of `worker` only."""
        self._check(payload)
        return lib.rq_push_local(self._q, self._w(worker), payload, len(payload)) == 0

    def pop_local(self, worker: int) -> bytes | None:
        """The oldest entry of `worker`'s ring (FIFO), or None."""
        return self._popped(lib.rq_pop_local(self._q, self._w(worker), self._buf, self.slot_size))

    def push_global(self, payload: bytes) -> bool:
        self._check(payload)
        return lib.rq_push_global(self._q, payload, len(payload)) == 0

    def pop_global(self) -> bytes | None:
        return self._popped(lib.rq_pop_global(self._q, self._buf, self.slot_size))

    def steal(self, thief: int, victim: int) -> int:
        """Moves the older half (rounded up) of `victim`'s ring onto `thief`'s, as far as it
        has room, in one step; returns how many. Owner of `thief` only."""
        if self._w(thief) == self._w(victim):
            raise ValueError("run queues: a worker cannot steal from itself")
        return lib.rq_steal(self._q, thief, victim)

    def wait(self, worker: int, timeout: float | None = None) -> bool:
        """Sleeps until a wake or visible work; False on timeout (or a signal)."""
        ns = -1 if timeout is None else max(0, int(timeout * 1e9))
        return bool(lib.rq_wait(self._q, self._w(worker), ns))

    def wake(self, worker: int) -> None:
        """Ends `worker`'s wait; if it is not waiting, its next wait returns True at once."""
        lib.rq_wake(self._q, self._w(worker))

    def lengths(self) -> tuple[list[int], int]:
        """(each worker's ring length, the global ring's length): a racy snapshot."""
        local = [lib.rq_local_len(self._q, w) for w in range(self.workers)]
        return local, lib.rq_global_len(self._q)

    def wait_begin(self, worker: int) -> tuple[int, int] | None:
        """`wait` for a worker that sleeps elsewhere (on its io_uring ring, with a FUTEX_WAIT
        on the word): None when there is no sleeping to do, else the futex word's address
        and the value to wait on; the worker is announced as a sleeper until `wait_end`."""
        word, seq = self._word
        if lib.rq_wait_begin(self._q, self._w(worker), word, seq):
            return None
        return word[0], seq[0]

    def wait_end(self, worker: int) -> None:
        lib.rq_wait_end(self._q, self._w(worker))

    def sleepers(self) -> int:
        """How many workers sleep in `wait` now."""
        return lib.rq_sleepers(self._q)

    def free_slots(self) -> int:
        """Slots on the free list; exact only while nobody pushes or pops."""
        return lib.rq_free_count(self._q)

    def _w(self, worker: int) -> int:
        if not 0 <= worker < self.workers:
            raise IndexError(f"run queues: no worker {worker} (there are {self.workers})")
        return worker

    def close(self) -> None:
        if self._q is not None:
            lib.rq_close(self._q)
            os.close(self.fd)
            self._q = None

    def __enter__(self) -> SharedQueues:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
