"""One pool worker process: pinned to one CPU, fed from the shared run queues, running
each task on the in-process scheduler, sending results back to the pool's owner.

    python -m xhagent.runtime.worker --queues FD_OR_PATH --results FD_OR_PATH \
        --index I --cpu C [--slice-ms 10] [--preempt auto] [--owner PID] [--contexts JSON]

`--contexts` is the task context pool's configuration (Pool's min_contexts, max_contexts,
idle_timeout and autoscale, see `contexts_config`); the feeder's own context is added to
min and max, so they count the tasks' contexts only.

Feeding: a feeder task in the last priority class (it runs once every task it started
has ended or parked, so its own loop never starves a low-class task) takes a batch of
payloads a round (about BATCH_WORK seconds of work by the last round's time per task, at
most BATCH), from its own ring first, then the global ring, then by stealing from the other
workers (round-robin victim), spawns each as a task, then yields so they run. With
nothing found and nothing else runnable it sleeps in the queues' futex wait, which any
push or `wake(index)` ends. While its tasks have reads or writes in flight (runtime.io) it
sleeps on its io_uring ring instead, with a FUTEX_WAIT on the same word armed in the ring:
a completion and a push end that sleep alike (Linux 6.7+; before, the sleep is cut at
IO_WAIT to look at the queues). Payloads stay in the rings, where others may steal them,
until the feeder takes them; only a round's batch is ever private to this process.

Memory: a worker keeps the heap memory its tasks free (heap.keep_freed), so that the next
burst's allocations (10k reads' results) take no page faults, and gives it back to the
kernel (heap.trim) once it has been idle a whole IDLE_WAIT.

Messages to the owner (the global ring of the results region), pickled lists:
  ("ready", index, pid, preempt)     once pinned and attached (preempt: the slice source);
  ("claim", index, [task_id, ...])   sent before a batch runs, so the owner knows whose
                                     tasks die with a killed worker;
  ("done", [(task_id, ok, value), ...])  the outcomes since the last one, sent when the
                                     feeder next runs (after the batch), or every
                                     RESULTS_PER_MESSAGE outcomes;
  ("ended", index, [task_id, ...])   other processes' tasks whose outcomes this worker
                                     pushed to their clients itself (runtime.clients);
  ("stats", index, contexts, steals, pool) with a flush, when the count of contexts ever
                                     made, the context pool's `pool` figures (live, cap, the
                                     autoscaler's changes, free, blocked, without the feeder's
                                     context, then the preemption signals seen and honoured)
                                     or the steal samples changed: `steals` are the latencies
                                     (ns) of the steals since the last report, each from the
                                     start of a look for work to a stolen task in hand.
A `None` payload or SIGTERM stops the worker after the running batch.

`fan_out` (a task, queued by `Pool.fan_out`) pushes calls onto its worker's own ring, where
the other workers steal them: the fork-join shape work stealing exists for.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import sys
import time
from time import perf_counter, perf_counter_ns
from types import CoroutineType

from .. import heap
from .autoscale import ScaleConfig
from .clients import CLIENT_BASE, Replies, seal
from .payload import decode_task, encode_task
from .queues import SharedQueues
from .scheduler import Scheduler

BATCH = 64
# Seconds of work a worker takes off the rings at once. Taken tasks are private (nobody can
# steal them), so 64 tasks of 1 ms would leave a neighbour idle for up to 64 ms at the end of
# a burst; the batch shrinks to this much work, by the measured time per task.
BATCH_WORK = 0.002
FIRST_BATCH = 8  # before any task has been timed: a burst of long tasks is not hoarded
# While a long task keeps the CPU the feeder gets no turn; the preemption handler tops the
# tasks in hand up to BATCH instead, and BATCH never goes below this: a task queued behind
# long ones still joins the time slicing, without the worker hoarding the queue.
IN_HAND = 4
RESULTS_PER_MESSAGE = 256  # outcomes held at most before a flush
STEAL_SAMPLES = 256  # kept per report at most: a worker stealing non-stop keeps the newest
IDLE_WAIT = 0.5  # seconds per futex wait; the loop also checks for a stop between waits
IO_WAIT = 0.001  # seconds asleep on the tasks' ring at most, where new work cannot wake it
STATS_EVERY = 0.5  # seconds between reports of preemption counts alone (a long task's)


def encode_results(results: list, limit: int) -> list[bytes]:
    """("done", [(task_id, ok, value), ...]) messages of at most `limit` bytes: the batch in
    one, else halves; a value that does not pickle, or alone exceeds `limit`, becomes a
    RuntimeError for its task."""
    try:
        blob = pickle.dumps(("done", results))
    except Exception:
        blob = None
    if blob is not None and len(blob) <= limit:
        return [blob]
    if len(results) > 1:
        mid = len(results) // 2
        return encode_results(results[:mid], limit) + encode_results(results[mid:], limit)
    task_id, ok, value = results[0]
    if blob is None:
        _, _, _, err = pickle.loads(encode_result(task_id, ok, value))
    else:
        err = RuntimeError(f"task {task_id}: its result is {len(blob)} bytes, over a slot")
    return [pickle.dumps(("done", [(task_id, False, err)]))]


def encode_result(task_id, ok: bool, value) -> bytes:
    """A ("done", ...) message; a value that does not pickle becomes a RuntimeError."""
    try:
        return pickle.dumps(("done", task_id, ok, value))
    except Exception as exc:
        what = "exception" if not ok else "result"
        err = RuntimeError(f"task {task_id}: its {what} {value!r} cannot be sent back: {exc}")
        return pickle.dumps(("done", task_id, False, err))


class Worker:
    BATCH = FIRST_BATCH  # the preemption handler's top-up: max(IN_HAND, batch)
    batch = FIRST_BATCH  # the feeder's take, per instance once timed (see BATCH_WORK)

    def __init__(self, queues, results, index: int, slice_ms: float = 10.0, contexts=None):
        self.q, self.r, self.index, self.slice_ms = queues, results, index, slice_ms
        self.n = queues.workers - 1  # the last ring is the owner's (rescue), not a worker's
        self.victim = (index + 1) % self.n
        self.out: list[bytes] = []
        self.out_size = 0
        self.results: list[tuple] = []  # (task_id, ok, value) not yet sent
        self.stopping = False
        # classes 0..2 for tasks, 3 for the feeder alone
        self.sched = Scheduler(classes=4, **scheduler_options(contexts or {}))
        self.done = 0
        self.slices = self.preempted = 0  # preemption signals seen, and honoured
        self.preempter = None
        self.preempt = "off"
        self.owner = 0  # the pool owner's pid: a worker outliving it stops when idle
        self.steal_ns: list[int] = []
        self.taken = 0  # tasks the last intake spawned
        self.contexts_sent = (0, None)
        self.signals_sent, self.signals_at = (0, 0), 0.0  # preemption counts last reported
        self.clients = False  # outcomes of other processes' tasks are in self.results
        self.replies = Replies()
        # Freed heap memory stays for the next burst (heap.keep_freed) until the worker has
        # been idle a whole IDLE_WAIT: then it goes back to the kernel, once.
        self.idle_waits = 0
        self.heap_used = False

    # -- results ---------------------------------------------------------------------
    def send(self, msg: bytes) -> None:
        if self.out_size + len(msg) + 64 > self.r.slot_size:
            self._push_out()
        self.out.append(msg)
        self.out_size += len(msg) + 8

    def flush(self) -> None:
        if self.results:
            results, self.results = self.results, []
            if self.clients:  # other processes' tasks ran: their outcomes go straight back
                self.clients = False
                theirs = [r for r in results if r[0] >= CLIENT_BASE]
                results = [r for r in results if r[0] < CLIENT_BASE]
                sent, rest = self.replies.send(theirs)
                results += rest  # undeliverable here: the owner passes them on
                if sent:
                    self.send(pickle.dumps(("ended", self.index, sent)))
            if results:
                for msg in encode_results(results, self.r.slot_size - 64):
                    self.send(msg)
        sched = self.sched
        # Without autoscaling the figures below move only with tasks run, but for the
        # preemption counts, which a long task moves alone: those go at most every
        # STATS_EVERY seconds when nothing else is sent.
        signals = (self.slices, self.preempted)
        if not self.out and sched._scaler is None:
            if signals == self.signals_sent or perf_counter() - self.signals_at < STATS_EVERY:
                return
        pool = sched.pool
        made = pool.created if pool is not None else 0
        figures = None
        if pool is not None:
            scaler = sched._scaler
            changes = scaler.changes + scaler.valves if scaler is not None else 0
            # the feeder's context left out: it is always bound, never free or blocked
            figures = (pool.live - 1, pool.cap - 1, changes, len(pool.free), pool.blocked)
            figures += signals
        if self.steal_ns or (made, figures) != self.contexts_sent:
            self.signals_sent, self.signals_at = signals, perf_counter()
            steals = self.steal_ns[-STEAL_SAMPLES:]
            self.send(pickle.dumps(("stats", self.index, made, steals, figures)))
            self.steal_ns, self.contexts_sent = [], (made, figures)
        self._push_out()

    def _push_out(self) -> None:
        if not self.out:
            return
        blob = pickle.dumps(self.out)
        while not self.r.push_global(blob):
            time.sleep(0.001)  # the owner is behind; its collector drains the ring
        self.out, self.out_size = [], 0

    def run_one(self, task_id, fn, args, kwargs):
        # Outcomes are pickled together when the feeder next flushes (one pickle per batch,
        # not one per task, and one to load at the owner's).
        try:
            value = fn(*args, **kwargs)
            if type(value) is CoroutineType:  # an `async def` function: run here, its traps too
                value = self.sched.await_in_task(value)
            outcome = (task_id, True, value)
        except Exception as exc:
            outcome = (task_id, False, exc)
        if task_id >= CLIENT_BASE:  # another process's (runtime.clients)
            outcome = (task_id, *seal(outcome[1], outcome[2]))
            self.clients = True
        # Read self.results only now: a flush at a preemption point inside fn swaps it.
        self.results.append(outcome)
        self.done += 1
        if len(self.results) >= RESULTS_PER_MESSAGE:
            self.flush()

    # -- feeding ---------------------------------------------------------------------
    def take(self, most: int = BATCH) -> list[bytes]:
        q, i, got = self.q, self.index, []
        while len(got) < most:
            p = q.pop_local(i)
            if p is None:
                p = q.pop_global()
            if p is None and self.n > 1 and not got:
                start = perf_counter_ns()  # the own ring and the global ring were looked at
                for _ in range(self.n - 1):  # one pass round the others, from the last victim
                    v = self.victim
                    self.victim = (v + 1) % self.n
                    if v == i:
                        v, self.victim = self.victim, (self.victim + 1) % self.n
                    if q.steal(i, v):
                        p = q.pop_local(i)
                        if p is not None:
                            self.steal_ns.append(perf_counter_ns() - start)
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
            item = decode_task(blob)
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
        self.taken = len(ids)
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
            sched.scale_tick()
            if not self.intake(self.batch):
                if self.io_wait():
                    sched.yield_()
                elif sched._alive > 1:  # others parked (sleeping): let timers fire
                    self.q.wait(self.index, 0.001)
                    sched.yield_()
                else:
                    if self.heap_used and self.idle_waits:
                        self.heap_used = False
                        heap.trim()
                    self.idle_waits += 1
                    self.q.wait(self.index, IDLE_WAIT)
                    if self.owner and os.getppid() != self.owner:
                        self.stopping = True  # the owner died without closing the pool
                continue
            self.idle_waits, self.heap_used = 0, True
            start = perf_counter()
            sched.yield_()  # the batch runs; the feeder comes back after it
            took = perf_counter() - start
            if took > 0 and self.taken:
                self.batch = max(1, min(BATCH, int(BATCH_WORK * self.taken / took)))
                self.BATCH = max(IN_HAND, self.batch)
        while sched._alive > 1:  # let the tasks already taken finish, then report them
            self.io_wait()
            sched.yield_()
        self.flush()

    def main(self) -> None:
        sched = self.sched
        heap.keep_freed()
        self.send(
            pickle.dumps(("ready", self.index, os.getpid(), self.preempt))
        )  # pinned and attached
        self.flush()
        self.sched.run(lambda: sched.spawn(self.feeder, priority=sched.classes - 1))


def contexts_config(
    min_contexts: int = 0,
    max_contexts: int = 65536,
    idle_timeout: float = 300.0,
    autoscale: bool | dict = False,
) -> dict:
    """The context pool's configuration as Pool takes it, checked (ValueError naming the
    field) and made JSON for `--contexts`. `autoscale`: False, True (the seed's thresholds)
    or a dict of ScaleConfig's thresholds (scale_up_wait_s, scale_up_factor,
    shrink_idle_ratio, shrink_factor, window_s, cooldown_s, interval_s)."""
    if not isinstance(autoscale, bool | dict):
        raise ValueError(f"autoscale must be true, false or a dict of thresholds: {autoscale!r}")
    if isinstance(autoscale, dict):
        unknown = set(autoscale) - set(ScaleConfig.__dataclass_fields__) - {"min", "max"}
        if unknown or "min" in autoscale or "max" in autoscale:
            bad = sorted(unknown | ({"min", "max"} & set(autoscale)))
            raise ValueError(
                f"autoscale: unknown threshold(s) {', '.join(bad)} (min and max are"
                " min_contexts and max_contexts)"
            )
    scale = {} if autoscale is True else autoscale or None
    cfg = {"min": min_contexts, "max": max_contexts, "idle_timeout": idle_timeout, "scale": scale}
    scheduler_options(cfg)  # every check, in the owner, before a worker starts
    return cfg


def scheduler_options(cfg: dict) -> dict:
    """Scheduler keyword arguments for a `contexts_config` (its feeder's context added)."""
    if not cfg:
        return {}
    lo, hi, idle = cfg["min"], cfg["max"], cfg["idle_timeout"]
    for name, v in (("min_contexts", lo), ("max_contexts", hi)):
        if type(v) is not int or v < 0:
            raise ValueError(f"{name} must be a whole number >= 0, not {v!r}")
    if hi < 1 or lo > hi:
        raise ValueError(f"contexts: need 1 <= max_contexts and min <= max, not {lo}..{hi}")
    if type(idle) not in (int, float) or not idle > 0:
        raise ValueError(f"idle_timeout must be a positive number of seconds, not {idle!r}")
    out = {"pool_min": lo + 1, "pool_max": hi + 1, "idle_timeout": idle}
    if cfg["scale"] is not None:
        out["scale"] = ScaleConfig(min=lo + 1, max=hi + 1, **cfg["scale"])
    return out


# The Worker of this process, for tasks that use its rings (fan_out).
_current: Worker | None = None


def fan_out(first_id: int, fn, items, priority: int) -> int:
    """A task: queue `fn(item)` for each item, with task ids from `first_id` on (reserved by
    the owner), on this worker's own ring; a full ring sends the rest to the global ring."""
    w = _current
    if w is None:
        raise RuntimeError("fan_out runs only as a task of a pool worker")
    q, index = w.q, w.index
    n = 0
    for n, item in enumerate(items, 1):
        blob = encode_task(first_id + n - 1, fn, (item,), {}, priority, None)
        if not q.push_local(index, blob):
            while not q.push_global(blob):
                time.sleep(0.001)
    return n


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
    from .preemption import MODES

    ap.add_argument("--preempt", choices=MODES, default="auto")
    ap.add_argument("--contexts", type=json.loads, default={})
    a = ap.parse_args(argv)
    os.sched_setaffinity(0, {a.cpu})
    q, r = _attach(a.queues), _attach(a.results)
    w = Worker(q, r, a.index, a.slice_ms, a.contexts)
    w.owner = a.owner
    # Run with -m, this module is __main__, a second copy: tasks import xhagent.runtime.worker
    # by name (fan_out), and that copy must know the Worker too.
    from . import worker as named

    globals()["_current"] = named._current = w

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
