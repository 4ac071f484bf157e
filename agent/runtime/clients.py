"""Submitting to a Pool from another process, with futures: `PoolClient(pool.address)`.

    with PoolClient(address) as client:      # address: Pool.address, passed by any means
        fut = client.submit(fn, *args, priority=1, deadline=None, **kwargs)
        client.map(fn, items)

A client pushes its tasks onto the pool's global ring like the owner does (the same
payload, pickled once); the workers run them as any other and push their outcomes straight
into the client's own reply region, while the pool's owner, which knows every claim and so
every lost worker, answers for the tasks that will not end:

  * task ids: a client's are its pid << 40, its reply region's fd << 32, plus a count (the
    owner's stay below 2^40), so the owner tells whose a claim is, and a worker where the
    outcome goes (`/proc/PID/fd/FD`), from the id alone;
  * a worker pickles a client task's value apart (`seal`): one value that does not load in
    the client fails its own task, not the batch; it pushes the batch to the region
    (`Replies`: attached once, checked to be the same file at each use, since a pid and fd
    may come back as another process's) and tells the owner which tasks ended, so that it
    drops their claims. A region it cannot reach (or fd 0 in the id: no region), and the
    WorkerLost of a dead worker's claimed tasks, go through the owner instead, which passes
    the sealed bytes on unread;
  * the client makes its reply region (a memfd) and says hello on the owner's results
    ring with its pid and the region's path;
  * the owner forgets a client that says bye or whose process is gone; at close it tells
    each client, whose outstanding futures then fail with PoolClosed, as they do when the
    client sees the owner's process gone.

The regions are reached through /proc/PID/fd paths, which only the same user (or root)
may open. A task that a worker took off the rings and died with before claiming it is
known to nobody: once the pool is quiet after a death (the owner's `_reconcile`: every
ring empty, nothing claimed, every live worker asleep, at two polls in a row) the owner
tells each client the time of the first such poll, and the client fails with WorkerLost
its tasks still pending whose push had returned before then (their outcomes, pushed
before the owner heard of their end, would have come first).
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from itertools import count

from ..signals import pid_alive
from .futures import PoolFuture, complete_all
from .payload import encode_task
from .queues import SharedQueues

CLIENT_SHIFT = 40
CLIENT_BASE = 1 << CLIENT_SHIFT
FD_SHIFT = 32  # the reply region's fd, 1..255 (0: none, through the owner)
POLL = 0.1  # seconds between the client's checks that the owner lives
PUSH_PATIENCE = 5.0  # seconds a full client ring is retried (by a worker or the owner)


class ClientError(RuntimeError):
    """A bad address, or a pool that cannot be reached."""


def seal(ok: bool, value) -> tuple[bool, bytes]:
    """A client task's outcome as bytes, loaded only by the client and each apart; a value
    that does not pickle becomes a RuntimeError saying so."""
    try:
        return ok, pickle.dumps(value)
    except Exception as exc:
        what = "result" if ok else "exception"
        err = RuntimeError(f"its {what} could not be pickled: {type(exc).__name__}: {exc}")
        return False, pickle.dumps(err)


def _unseal(ok: bool, blob: bytes):
    try:
        return ok, pickle.loads(blob)
    except Exception as exc:
        return False, RuntimeError(f"its outcome did not unpickle here: {exc!r}")


class Relay:
    """The owner's side: the clients by pid, their reply regions, outcomes routed. Called
    from the pool's collector thread only."""

    def __init__(self):
        self.clients: dict[int, SharedQueues] = {}
        self.routed = 0  # outcomes passed on (the rest went from the workers themselves)

    def hello(self, pid: int, path: str) -> None:
        try:
            region = SharedQueues.attach(path)
        except (OSError, ValueError):
            return  # gone already, or not a region: nothing to answer to
        old = self.clients.pop(pid, None)
        if old is not None:
            old.close()
        self.clients[pid] = region

    def bye(self, pid: int) -> None:
        region = self.clients.pop(pid, None)
        if region is not None:
            region.close()

    def route(self, outcomes) -> None:
        """(task_id, ok, sealed) of clients' tasks, to their clients."""
        self.routed += len(outcomes)
        by_client = defaultdict(list)
        for item in outcomes:
            by_client[item[0] >> CLIENT_SHIFT].append(item)
        for pid, items in by_client.items():
            region = self.clients.get(pid)
            if region is None:
                continue  # the client left; nobody waits for these
            limit = region.slot_size - 64
            for blob in _messages(items, limit):
                self._push(pid, region, blob)

    def lost(self, failures) -> None:
        """(task_id, exception) of clients' tasks that will not end."""
        self.route([(tid, *seal(False, exc)) for tid, exc in failures])

    def _push(self, pid: int, region: SharedQueues, blob: bytes) -> None:
        if not _push(pid, region, blob):
            self.bye(pid)  # a client that stopped reading must not stall the pool

    def quiet_loss(self, since: float, why: str) -> None:
        """Tell every client the pool was quiet from `since` (time.monotonic) after a worker
        died: its tasks pushed before then and still pending were lost with that worker."""
        for pid, region in list(self.clients.items()):
            self._push(pid, region, pickle.dumps(("lost", since, why)))

    def check(self) -> None:
        for pid in [p for p in self.clients if not pid_alive(p)]:
            self.bye(pid)

    def close(self) -> None:
        for pid, region in list(self.clients.items()):
            self._push(pid, region, pickle.dumps(("closed",)))
            self.bye(pid)


class Replies:
    """A worker's side: its clients' outcomes pushed straight to their reply regions."""

    def __init__(self):
        self.regions: dict[tuple[int, int], tuple[SharedQueues, tuple[int, int]]] = {}

    def send(self, outcomes: list) -> tuple[list[int], list]:
        """Push (task_id, ok, sealed) to their clients: (the ids sent, the outcomes this
        worker could not deliver, for the owner to pass on)."""
        by_region = defaultdict(list)
        for item in outcomes:
            tid = item[0]
            by_region[(tid >> CLIENT_SHIFT, (tid >> FD_SHIFT) & 0xFF)].append(item)
        sent, rest = [], []
        for (pid, fd), items in by_region.items():
            region = self._region(pid, fd) if fd else None
            if region is None:
                rest += items
                continue
            for blob in _messages(items, region.slot_size - 64):
                _push(pid, region, blob)  # one that gave up: the client stopped reading
            sent += [item[0] for item in items]
        return sent, rest

    def _region(self, pid: int, fd: int) -> SharedQueues | None:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            st = os.stat(path)
        except OSError:
            self._drop((pid, fd))
            return None
        got = self.regions.get((pid, fd))
        if got is not None and got[1] == (st.st_dev, st.st_ino):
            return got[0]
        self._drop((pid, fd))  # another file by now: a new process with the same pid
        try:
            region = SharedQueues.attach(path)
        except (OSError, ValueError):
            return None
        self.regions[(pid, fd)] = (region, (st.st_dev, st.st_ino))
        return region

    def _drop(self, key) -> None:
        got = self.regions.pop(key, None)
        if got is not None:
            got[0].close()


def _push(pid: int, region: SharedQueues, blob: bytes) -> bool:
    """Push `blob`, retrying while the ring is full, for PUSH_PATIENCE at most and only
    while `pid` (the reader) lives; whether it went."""
    deadline = time.monotonic() + PUSH_PATIENCE
    while not region.push_global(blob):
        if time.monotonic() > deadline or not pid_alive(pid):
            return False
        time.sleep(0.0005)
    return True


def _messages(items: list, limit: int) -> list[bytes]:
    blob = pickle.dumps(("done", items))
    if len(blob) <= limit or len(items) == 1:
        if len(blob) > limit:  # one outcome over a slot: its task fails with the reason
            tid = items[0][0]
            err = RuntimeError(f"task {tid}: its outcome is {len(blob)} bytes, over a slot")
            blob = pickle.dumps(("done", [(tid, *seal(False, err))]))
        return [blob]
    mid = len(items) // 2
    return _messages(items[:mid], limit) + _messages(items[mid:], limit)


class PoolClient:
    """Submit to the Pool at `address` (its `Pool.address`) from this process."""

    def __init__(self, address):
        try:
            qpath, rpath, owner = address
            self._q = SharedQueues.attach(qpath)
        except (TypeError, ValueError, OSError) as exc:
            raise ClientError(f"pool address {address!r}: {exc}") from None
        try:
            self._owner_r = SharedQueues.attach(rpath)
        except (ValueError, OSError) as exc:
            self._q.close()
            raise ClientError(f"pool address {address!r}: {exc}") from None
        self.owner = int(owner)
        self._r = SharedQueues.create(1, 1024, slots=1024, slot_size=self._owner_r.slot_size)
        fd = self._r.fd if 0 < self._r.fd < 256 else 0  # else every outcome via the owner
        self._base = os.getpid() << CLIENT_SHIFT | fd << FD_SHIFT
        self._ids = count()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._closed = False  # no more submissions, outstanding futures failed
        self._shut = False  # close() has run
        self._say(("hello", os.getpid(), self._r.path))
        self._collector = threading.Thread(target=self._collect, name="pool-client", daemon=True)
        self._collector.start()

    def _say(self, msg) -> None:
        blob = pickle.dumps([pickle.dumps(msg)])  # the shape of a worker's batch of messages
        while not self._owner_r.push_global(blob):
            time.sleep(0.0005)

    def submit(self, fn, /, *args, priority: int = 1, deadline: float | None = None, **kwargs):
        """As Pool.submit: a Future of `fn(*args, **kwargs)` run on some worker."""
        if not 0 <= priority <= 2:
            raise ValueError(f"priority {priority!r} is not in 0..2")
        fut = PoolFuture()
        with self._lock:
            if self._closed:
                from .pool import PoolClosed

                raise PoolClosed("submit on a closed client")
            tid = self._base | next(self._ids)
            self._pending[tid] = fut
        blob = encode_task(tid, fn, args, kwargs, priority, deadline)
        while not self._q.push_global(blob):
            if self._closed:
                break
            time.sleep(0.0005)  # the global ring is full: the workers are behind
        fut._pushed = time.monotonic()  # after the push: see "lost" in _collect
        return fut

    def map(self, fn, iterable, timeout: float | None = None) -> list:
        futs = [self.submit(fn, x) for x in iterable]
        return [f.result(timeout) for f in futs]

    def _collect(self) -> None:
        r = self._r
        while not self._closed and not self._shut:
            blob = r.pop_global()
            if blob is None:
                if not r.wait(0, POLL) and not pid_alive(self.owner):
                    self._fail_all(f"the pool's owner (pid {self.owner}) is gone")
                    return
                continue
            msg = pickle.loads(blob)
            if msg[0] == "closed":
                self._fail_all("the pool was closed")
                return
            if msg[0] == "lost":
                self._lost_before(*msg[1:])
                continue
            with self._lock:
                got = [(self._pending.pop(tid, None), ok, sealed) for tid, ok, sealed in msg[1]]
            complete_all([(fut, *_unseal(ok, sealed)) for fut, ok, sealed in got if fut])

    def _lost_before(self, since: float, why: str) -> None:
        """The owner found the pool quiet from `since` after a worker died: a task pushed
        before then and still pending was taken by that worker and never claimed."""
        from .pool import WorkerLost

        with self._lock:
            lost = [(t, f) for t, f in self._pending.items() if f._pushed < since]
            for t, _ in lost:
                del self._pending[t]
        complete_all([(f, False, WorkerLost(f"task {t} was lost with {why}")) for t, f in lost])

    def _fail_all(self, why: str) -> None:
        from .pool import PoolClosed

        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, {}
        complete_all(
            [
                (fut, False, PoolClosed(f"task {tid}: {why} before it ended"))
                for tid, fut in pending.items()
            ]
        )

    def close(self) -> None:
        if self._shut:
            return
        self._shut = True
        try:
            self._say(("bye", os.getpid()))
        except Exception:
            pass  # the owner's region is what failed: nobody to tell
        self._closed = True
        self._r.wake(0)
        self._collector.join()
        self._fail_all("the client was closed")
        for region in (self._q, self._owner_r, self._r):
            region.close()

    def __enter__(self) -> PoolClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
