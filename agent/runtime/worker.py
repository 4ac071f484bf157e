"""One pool worker process: pinned to one CPU, fed from the shared run queues, running
each task on the in-process scheduler, sending results back to the pool's owner.

    python -m xhagent.runtime.worker --queues FD_OR_PATH --results FD_OR_PATH \
        --index I --cpu C [--slice-ms 10] [--preempt auto] [--owner PID]

Feeding: a feeder task in the last priority class (it runs once every task it started
has ended or parked, so its own loop never starves a low-class task) takes up to BATCH payloads a
round, from its own ring first, then the global ring, then by stealing from the other
workers (round-robin victim), spawns each as a task, then yields so they run. With
nothing found and nothing else runnable it sleeps in the queues' futex wait, which any
push or `wake(index)` ends. While its tasks have reads or writes in flight (runtime.io) it
sleeps on its io_uring ring instead, with a FUTEX_WAIT on the same word armed in the ring:
a completion and a push end that sleep alike (Linux 6.7+; before, the sleep is cut at
IO_WAIT to look at the queues). Payloads stay in the rings, where others may steal them,
until the feeder takes them; only a round's batch is ever private to this process.

Messages to the owner (the global ring of the results region), pickled lists:
  ("ready", index, pid, preempt)     once pinned and attached (preempt: the slice source);
  ("claim", index, [task_id, ...])   sent before a batch runs, so the owner knows whose
                                     tasks die with a killed worker;
  ("done", task_id, ok, value)       buffered, sent when the feeder next runs (after the
                                     batch) or when the buffer fills a slot.
A `None` payload or SIGTERM stops the worker after the running batch.
"""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import sys
import time

from .queues import SharedQueues
from .scheduler import Scheduler

BATCH = 64
IDLE_WAIT = 0.5  # seconds per futex wait; the loop also checks for a stop between waits
IO_WAIT = 0.001  # seconds asleep on the tasks' ring at most, where new work cannot wake it
STOP = pickle.dumps(None)


def encode_result(task_id, ok: bool, value) -> bytes:
    """A ("done", ...) message; a value that does not pickle becomes a RuntimeError."""
    try:
        return pickle.dumps(("done", task_id, ok, value))
    except Exception as exc:
        what = "exception" if not ok else "result"
        err = RuntimeError(f"task {task_id}: its {what} {value!r} cannot be sent back: {exc}")
        return pickle.dumps(("done", task_id, False, err))


class Worker:
    BATCH = BATCH

    def __init__(self, queues, results, index: int, slice_ms: float = 10.0):
        self.q, self.r, self.index, self.slice_ms = queues, results, index, slice_ms
        self.n = queues.workers - 1  # the last ring is the owner's (rescue), not a worker's
        self.victim = (index + 1) % self.n
        self.out: list[bytes] = []
        self.out_size = 0
        self.stopping = False
        self.sched = Scheduler(classes=4)  # 0..2 for tasks, 3 for the feeder alone
        self.done = 0
        self.slices = self.preempted = 0  # preemption signals seen, and honoured
        self.preempter = None
        self.preempt = "off"
        self.owner = 0  # the pool owner's pid: a worker outliving it stops when idle

    # -- results ---------------------------------------------------------------------
    def send(self, msg: bytes) -> None:
        if self.out_size + len(msg) + 64 > self.r.slot_size:
            self.flush()
        self.out.append(msg)
        self.out_size += len(msg) + 8

    def flush(self) -> None:
        if not self.out:
            return
        blob = pickle.dumps(self.out)
        while not self.r.push_global(blob):
            time.sleep(0.001)  # the owner is behind; its collector drains the ring
        self.out, self.out_size = [], 0

    def run_one(self, task_id, fn, args, kwargs):
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            msg = encode_result(task_id, False, exc)
        else:
            msg = encode_result(task_id, True, value)
        if len(msg) > self.r.slot_size - 64:
            err = RuntimeError(f"task {task_id}: its result is {len(msg)} bytes, over a slot")
            msg = pickle.dumps(("done", task_id, False, err))
        self.done += 1
        self.send(msg)

    # -- feeding ---------------------------------------------------------------------
    def take(self, most: int = BATCH) -> list[bytes]:
        q, i, got = self.q, self.index, []
        while len(got) < most:
            p = q.pop_local(i)
            if p is None:
                p = q.pop_global()
            if p is None and self.n > 1 and not got:
                for _ in range(self.n - 1):  # one pass round the others, from the last victim
                    v = self.victim
                    self.victim = (v + 1) % self.n
                    if v == i:
                        v, self.victim = self.victim, (self.victim + 1) % self.n
                    if q.steal(i, v):
                        p = q.pop_local(i)
                        break
            if p is None:
                break
            got.append(p)
        return got

    def intake(self, most: int = BATCH) -> bool:
        """Take a batch and spawn it, claimed; False when there was nothing. The feeder
        calls it, and so does the preemption handler (at a safe point), since the feeder,
        in the last class, gets no turn while a task keeps the CPU."""
        batch = self.take(most) if not self.stopping and most > 0 else []
        if not batch:
            return False
        ids = []
        for n, blob in enumerate(batch):
            item = pickle.loads(blob)
            if item is None:  # the rest of the batch goes back for the other workers
                self.stopping = True
                for rest in batch[n + 1 :]:
                    while not self.q.push_global(rest):
                        time.sleep(0.001)
                break
            task_id, fn, args, kwargs, priority, deadline = item
            ids.append(task_id)
            self.sched.spawn(
                self.run_one, task_id, fn, args, kwargs, priority=priority, deadline=deadline
            )
        if ids:
            self.send(pickle.dumps(("claim", self.index, ids)))
        self.flush()  # the claim is out before any of these tasks runs
        return True

    def io_wait(self) -> bool:
        """With tasks' requests in flight on the ring (runtime.io): reap, and when nothing had
        completed sleep on the ring until a completion, another thread's wake-up, the next
        timer or new work for this worker (a FUTEX_WAIT on its run-queue word, armed in the
        ring; where the kernel lacks it, IO_WAIT bounds the sleep instead). False, doing
        nothing, when no request is in flight."""
        sched = self.sched
        io = sched._io
        if io is None or not io.inflight:
            return False
        sched._wakeup.clear()  # the hub, which clears it, does not run while the feeder lives
        if io.poll():
            return True
        timers = sched._timers
        if not io.futex_wait:
            io.sleep(min(IO_WAIT, timers[0][0] - sched.clock()) if timers else IO_WAIT)
            return True
        word = self.q.wait_begin(self.index)
        if word is None:  # work came (or a wake): no sleeping
            return True
        try:
            io.sleep(min(IDLE_WAIT, timers[0][0] - sched.clock()) if timers else IDLE_WAIT, word)
        finally:
            self.q.wait_end(self.index)
        return True

    def feeder(self) -> None:
        sched = self.sched
        while not self.stopping:
            self.flush()
            if not self.intake():
                if self.io_wait():
                    sched.yield_()
                elif sched._alive > 1:  # others parked (sleeping): let timers fire
                    self.q.wait(self.index, 0.001)
                    sched.yield_()
                else:
                    self.q.wait(self.index, IDLE_WAIT)
                    if self.owner and os.getppid() != self.owner:
                        self.stopping = True  # the owner died without closing the pool
                continue
            sched.yield_()  # the batch runs; the feeder comes back after it
        while sched._alive > 1:  # let the tasks already taken finish, then report them
            self.io_wait()
            sched.yield_()
        self.flush()

    def main(self) -> None:
        sched = self.sched
        self.send(
            pickle.dumps(("ready", self.index, os.getpid(), self.preempt))
        )  # pinned and attached
        self.flush()
        self.sched.run(lambda: sched.spawn(self.feeder, priority=sched.classes - 1))


def _attach(spec: str) -> SharedQueues:
    return SharedQueues.attach(int(spec) if spec.isdigit() else spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="xhagent.runtime.worker")
    ap.add_argument("--queues", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--cpu", type=int, required=True)
    ap.add_argument("--slice-ms", type=float, default=10.0)
    ap.add_argument("--owner", type=int, default=0, help="stop when no longer its child")
    ap.add_argument("--preempt", choices=("auto", "bpf", "timer", "off", "owner"), default="auto")
    a = ap.parse_args(argv)
    os.sched_setaffinity(0, {a.cpu})
    q, r = _attach(a.queues), _attach(a.results)
    w = Worker(q, r, a.index, a.slice_ms)
    w.owner = a.owner

    def on_term(signum, frame):
        w.stopping = True
        q.wake(a.index)

    signal.signal(signal.SIGTERM, on_term)
    from .preemption import install

    w.preempt = install(w, a.slice_ms, a.preempt)
    w.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
