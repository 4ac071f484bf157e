"""`AsyncRing`: io_uring completions delivered to an asyncio loop through a registered eventfd.

Coroutines queue SQEs at once; one submit per loop iteration (call_soon) sends everything
queued since. Completions are reaped in bulk when the eventfd fires (and right after each
submit, for I/O the kernel finished inline) and resolve their futures.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Sequence

from .files import FIRST_READ, FileRounds
from .ring import Ring, UringError, ffi


class AsyncRing:
    def __init__(
        self,
        entries: int = 256,
        *,
        file_slots: int = 64,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        self.loop = loop or asyncio.get_running_loop()
        self.ring = Ring(entries)
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.ring.register_eventfd(self.efd)
        self.ring.register_files([-1] * file_slots)
        self._free_slots = list(range(file_slots))
        self._slot_waiters: deque[asyncio.Future] = deque()
        self._waiting: dict[int, tuple] = {}  # op id -> (future, keepalive)
        self._backlog: deque = deque()  # preparations waiting for SQ space
        # In flight stays within the CQ: overflowed completions would need a GETEVENTS enter.
        self._limit = self.ring.cq_entries
        self._next_id = 0
        self._flush_scheduled = False
        self.submits = 0  # io_uring_submit calls: ops per submit shows the batching
        self.loop.add_reader(self.efd, self._on_eventfd)

    # -- public operations ------------------------------------------------------------
    async def read(self, fd: int, length: int, offset: int) -> bytearray:
        """Up to `length` bytes at `offset` (shorter at EOF), like os.pread."""
        buf = bytearray(length)
        n = await self.read_into(fd, buf, offset)
        del buf[n:]
        return buf

    async def read_into(self, fd: int, buf, offset: int) -> int:
        return await self._rw(False, fd, buf, offset)

    async def write(self, fd: int, data, offset: int) -> int:
        return await self._rw(True, fd, data, offset)

    async def read_files(
        self, paths: Sequence[str | os.PathLike], first: int = FIRST_READ
    ) -> list[bytes | OSError]:
        """As xhagent.io.read_files, on this ring: each file's bytes or its own OSError."""
        rounds = FileRounds(paths, first)
        while not rounds.done:
            size = rounds.size
            buf = bytearray(len(rounds.pending) * size)
            view = memoryview(buf)
            res = await asyncio.gather(
                *(
                    self._chain(rounds.paths[i], view[k * size : (k + 1) * size])
                    for k, i in enumerate(rounds.pending)
                )
            )
            rounds.complete_round(res, buf)
        return rounds.results  # type: ignore[return-value]

    # -- plumbing -----------------------------------------------------------------------
    def _new_op(self, keep) -> tuple[int, asyncio.Future]:
        if self.ring.closed:
            raise UringError(9, "AsyncRing is closed", "AsyncRing")
        op_id = self._next_id
        self._next_id += 1
        fut = self.loop.create_future()
        self._waiting[op_id] = (fut, keep)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)
        return op_id, fut

    async def _rw(self, write: bool, fd: int, buf, offset: int) -> int:
        ptr = ffi.from_buffer(buf, require_writable=not write)
        op_id, fut = self._new_op(ptr)
        self._queue(1, self.ring.prep_rw, (write, fd, ptr, len(ptr), offset, op_id << 2))
        res = await fut
        if res < 0:
            raise UringError.from_res(res, f"{'write' if write else 'read'} fd {fd} @ {offset}")
        return res

    async def _chain(self, path: str, buf: memoryview) -> int:
        """One openat -> read -> close chain into `buf`: bytes read, or the first -errno."""
        slot = await self._slot()
        try:
            path_c = ffi.new("char[]", os.fsencode(path))
            ptr = ffi.from_buffer(buf)
            op_id, fut = self._new_op((path_c, ptr))
            fut.chain = [None, None, None]  # open, read, close results
            self._queue(3, self.ring.prep_file_chain, (path_c, slot, ptr, len(buf), op_id << 2))
            open_res, read_res, _ = await fut
            return open_res if open_res < 0 else read_res
        finally:
            self._release_slot(slot)

    def _queue(self, sqes: int, prep, args) -> None:
        if self._backlog or not self._try(sqes, prep, args):
            self._backlog.append((sqes, prep, args))

    def _try(self, sqes: int, prep, args) -> bool:
        return self.ring.pending + sqes <= self._limit and prep(*args)

    async def _slot(self) -> int:
        while not self._free_slots:
            waiter = self.loop.create_future()
            self._slot_waiters.append(waiter)
            await waiter
        return self._free_slots.pop()

    def _release_slot(self, slot: int) -> None:
        self._free_slots.append(slot)
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.ring.closed:
            return
        while True:
            self.ring.submit()
            self.submits += 1
            while self._backlog:
                if not self._try(*self._backlog[0]):
                    break
                self._backlog.popleft()
            else:
                break
            if self.ring.pending + self._backlog[0][0] > self._limit:
                break  # the CQ is full of work: completions make room
        self._dispatch()
        if self._backlog and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _on_eventfd(self) -> None:
        try:
            os.eventfd_read(self.efd)
        except BlockingIOError:
            pass
        self._dispatch()
        if self._backlog:
            self._flush()

    def _dispatch(self) -> None:
        for user_data, res in self.ring.reap():
            self._complete(user_data, res)

    def _complete(self, user_data: int, res: int) -> None:
        entry = self._waiting.get(user_data >> 2)
        if entry is None:
            return
        fut, _ = entry
        kind = user_data & 3
        if kind:
            fut.chain[kind - 1] = res
            if None in fut.chain:
                return
            res = tuple(fut.chain)
        del self._waiting[user_data >> 2]
        if not fut.done():
            fut.set_result(res)

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """Cancel what is in flight, wait for the kernel to let go of every buffer, then close."""
        if self.ring.closed:
            return
        self.loop.remove_reader(self.efd)
        self._backlog.clear()
        for user_data, res in self.ring.cancel_all():
            self._complete(user_data, res)
        for fut, _ in self._waiting.values():
            if not fut.done():
                fut.cancel()
        self._waiting.clear()
        self.ring.close()
        os.close(self.efd)

    async def __aenter__(self) -> AsyncRing:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()
