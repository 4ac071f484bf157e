"""The per-CPU worker pool: one pinned worker process per allowed CPU (runtime.worker),
fed through shared-memory run queues, with futures completed by a collector thread.

Regions (both `SharedQueues`):
  * tasks: one ring per worker plus one more, the owner's own (index `len(cpus)`), which
    it uses only to take a dead worker's queue back (`steal` needs a thief ring the
    caller owns, and the owner may not push to a worker's ring); and the global ring,
    where `submit` pushes each task as runtime.payload.encode_task makes it (a header, then
    the pickled function and arguments);
  * results: one ring slot (the owner's collector waits on it) whose global ring carries
    the workers' batched ("claim", ...) and ("done", ...) messages (see runtime.worker),
    and the ("hello", ...) and ("bye", ...) of PoolClients in other processes, whose
    outcomes the collector passes on to them (runtime.clients).

Lost workers: the collector polls each worker's process every POLL seconds. A dead one's
messages already in the results ring are applied first; then the tasks it had claimed
and not finished fail with WorkerLost, and what is still queued on its ring is stolen
onto the owner's ring and pushed back to the global ring for the others. Tasks it took
but died before claiming are failed once the pool is quiet (`_reconcile`).

Functions travel by reference, as with multiprocessing's spawn method: they must be
importable module-level functions; the workers get the owner's sys.path (as it was when
the pool started) for that. A task a worker cannot load fails alone, with TaskLoadError.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from itertools import count

from .clients import CLIENT_BASE, Relay
from .futures import PoolFuture, complete, complete_all
from .payload import TaskLoadError, encode_task
from .queues import SharedQueues
from .worker import contexts_config

__all__ = ["Pool", "PoolClosed", "PoolFuture", "TaskLoadError", "WorkerLost"]

POLL = 0.1  # seconds between checks that the workers live
# A pool's choices of time slice source (runtime.preemption.MODES but "owner", which is the
# pool's own arming from here, passed to its workers when the BPF program loaded)
PREEMPT_MODES = ("auto", "bpf", "timer", "off")


class WorkerLost(RuntimeError):
    """The worker running a task died before sending its result."""


class PoolClosed(RuntimeError):
    """The pool was closed before the task's result came back."""


class _Worker:
    def __init__(self, index: int, cpu: int, proc, group):
        self.index, self.cpu, self.proc, self.group = index, cpu, proc, group
        self.pid = proc.pid
        self.claimed: set[int] = set()
        self.done = 0
        self.alive = True
        self.retiring = False  # its CPU left the allowed set: stopping, not dead
        self.ready = False
        self.preempt = None  # the worker's slice source: bpf, timer or off
        self.contexts = 0  # task contexts it has ever made (flat once warm: they are reused)
        self.context_pool = None  # (live, cap, autoscale changes) at its last report
        self.steals = 0

    def describe(self) -> str:
        return f"worker {self.index} (cpu {self.cpu}, pid {self.pid})"


class Pool:
    def __init__(
        self,
        cpus=None,
        slice_ms: float = 10.0,
        subtree=None,  # str (for locate()) or a located Subtree: workers in <subtree>/pool/<cpu>
        *,
        ring_size: int = 4096,
        slot_size: int = 4096,
        python: str = sys.executable,
        start_timeout: float = 60.0,
        preempt: str = "auto",
        min_contexts: int = 0,
        max_contexts: int = 65536,
        idle_timeout: float = 300.0,
        autoscale: bool | dict = False,
    ):
        if preempt not in PREEMPT_MODES:
            raise ValueError(f"preempt {preempt!r} is not one of {', '.join(PREEMPT_MODES)}")
        # each worker's task contexts (runtime.worker.contexts_config: checked here, before
        # any worker starts)
        self._contexts = contexts_config(min_contexts, max_contexts, idle_timeout, autoscale)
        self.cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
        if not self.cpus:
            raise ValueError("a pool needs at least one CPU")
        n = len(self.cpus)
        self._q = SharedQueues.create(n + 1, ring_size, slot_size=slot_size)
        # Result slots hold a worker's batch of messages; few are needed, each larger.
        self._r = SharedQueues.create(1, 1024, slots=1024, slot_size=16384)
        self._ids = count()
        self._last_tid = -1  # the last task id handed out: the reconciler's "no submissions"
        self._deaths: list[str] = []
        self._deaths_told = 0  # of them, those the clients were told of (_reconcile)
        self._quiet_at = 0.0
        self._quiet_mark = None
        self._pending: dict[int, Future] = {}
        self._claims: dict[int, int] = {}  # task id -> worker index
        self._lock = threading.Lock()
        self._closed = False
        self._stop = False
        self._groups = []
        self._ready = threading.Event()  # set once every worker has said it is pinned
        self._steal_ns: deque[int] = deque(maxlen=65536)  # the workers' newest steal latencies
        self._relay = Relay()  # PoolClients of other processes (runtime.clients)
        self.workers: list[_Worker] = []
        self._preempter = None
        try:
            preempt = self._load_preempter(preempt, slice_ms)
            self._start(python, slice_ms, subtree, preempt)
        except BaseException:
            self._stop_workers(0)
            self._release()
            raise
        self._collector = threading.Thread(target=self._collect, name="pool-collector", daemon=True)
        self._collector.start()
        if not self._ready.wait(start_timeout) or not all(w.ready for w in self.workers):
            bad = [w.describe() for w in self.workers if not w.ready]
            self.close(0)
            raise RuntimeError(f"pool: {', '.join(bad)} did not start (see its stderr)")

    # -- workers ---------------------------------------------------------------------
    def _load_preempter(self, preempt: str, slice_ms: float) -> str:
        """One BPF Preempter for the whole pool, armed on each worker's thread from here;
        the workers' mode: owner (armed from here), timer (their own fallback) or off."""
        if preempt not in ("auto", "bpf") or slice_ms <= 0:
            return preempt
        try:
            from xhagent.bpf.preempt import Preempter

            self._preempter = Preempter()
        except Exception:
            if preempt == "bpf":
                raise
            return "timer"  # no BPF here (not root, no BTF): a CPU-time timer per worker thread
        return "owner"

    def _start(self, python: str, slice_ms: float, subtree: str | None, preempt: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # fns by reference
        parent = None
        if subtree is not None:
            from xhagent.cgroups import Cgroup
            from xhagent.cgroups.subtree import locate

            sub = locate(subtree) if isinstance(subtree, str) else subtree  # or a Subtree
            sub.ensure()
            parent = Cgroup(sub.group("pool").path).create(exist_ok=True)
        self._spawn_args = (python, slice_ms, preempt, env, parent)
        for index in range(len(self.cpus)):
            self.workers.append(self._spawn(index))

    def _spawn(self, index: int) -> _Worker:
        """Worker `index`, pinned to self.cpus[index], in its leaf pool/<cpu> when the pool
        has a subtree (there from its first instruction: clone3 CLONE_INTO_CGROUP)."""
        python, slice_ms, preempt, env, parent = self._spawn_args
        cpu = self.cpus[index]
        fds = (self._q.fd, self._r.fd)
        argv = [
            python, "-m", "xhagent.runtime.worker",
            "--queues", str(self._q.fd), "--results", str(self._r.fd),
            "--index", str(index), "--cpu", str(cpu), "--slice-ms", str(slice_ms),
            "--preempt", preempt, "--owner", str(os.getpid()),
            "--contexts", json.dumps(self._contexts),
        ]  # fmt: skip
        group = None
        if parent is None:
            proc = subprocess.Popen(argv, env=env, pass_fds=fds)
        else:
            from ..cgroups.spawn import WORKLOAD_OOM_SCORE_ADJ

            group = type(parent)(parent.path / str(cpu)).create(exist_ok=True)
            if all(g.path != group.path for g in self._groups):  # a worker started again
                self._groups.append(group)
            # a worker runs its clients' code: the OOM killer spares it no more than a task
            proc = group.spawn(argv, env=env, pass_fds=fds, oom_score_adj=WORKLOAD_OOM_SCORE_ADJ)
        if self._preempter is not None:  # its main thread's tid is its pid
            self._preempter.arm(proc.pid, int(slice_ms * 1e6))
        return _Worker(index, cpu, proc, group)

    def _stop_workers(self, timeout: float) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.terminate()  # the worker stops after its running batch
                self._q.wake(w.index)
        end = time.monotonic() + timeout
        for w in self.workers:
            try:
                w.proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            w.alive = False

    def _release(self) -> None:
        for g in reversed(self._groups):
            try:
                g.remove(kill_first=True)
            except OSError:
                pass
        if self._groups:
            try:
                self._groups[0].path.parent.rmdir()  # <subtree>/pool, if nobody else uses it
            except OSError:
                pass
        if self._preempter is not None:
            self._preempter.close()
        self._q.close()
        self._r.close()

    @property
    def address(self) -> tuple[str, str, int]:
        """What a PoolClient in another process (of the same user, or root) connects to:
        the run queues' and the results region's paths, and this process's pid."""
        return (self._q.path, self._r.path, os.getpid())

    # -- submitting ------------------------------------------------------------------
    def submit(self, fn, /, *args, priority: int = 1, deadline: float | None = None, **kwargs):
        """Run `fn(*args, **kwargs)` on some worker; a Future of its result. `priority` is
        the class (0 first, 0..2); `deadline` is absolute on time.monotonic (EDF in class)."""
        if not 0 <= priority <= 2:
            raise ValueError(f"priority {priority!r} is not in 0..2")
        fut = PoolFuture()
        with self._lock:
            if self._closed:
                raise PoolClosed("submit on a closed pool")
            tid = self._last_tid = next(self._ids)
            self._pending[tid] = fut
        try:
            blob = encode_task(tid, fn, args, kwargs, priority, deadline)
            while not self._q.push_global(blob):
                if self._closed:
                    raise PoolClosed("the pool was closed while the task waited for room")
                time.sleep(0.0005)  # the global ring is full: the workers are behind
        except BaseException:
            with self._lock:
                self._pending.pop(tid, None)
            raise
        return fut

    def map(self, fn, iterable, chunksize: int = 1, timeout: float | None = None):
        """fn over the items, results in order (a list, as the futures all complete)."""
        items = list(iterable)
        if chunksize <= 1:
            futs = [self.submit(fn, x) for x in items]
            return [f.result(timeout) for f in futs]
        chunks = [items[i : i + chunksize] for i in range(0, len(items), chunksize)]
        futs = [self.submit(_chunk, fn, c) for c in chunks]
        return [y for f in futs for y in f.result(timeout)]

    def fan_out(self, fn, items, *, priority: int = 1) -> list[Future]:
        """`fn(item)` for each item, queued by ONE worker (whichever takes the fan-out) on
        its own ring, from which idle workers steal: the fork-join shape, where one worker
        holds all the work at first. Futures in item order. The items travel together in
        one payload (they must fit a slot: a range, a short list of small values); calls
        past the worker's ring size go to the global ring."""
        if not 0 <= priority <= 2:
            raise ValueError(f"priority {priority!r} is not in 0..2")
        if not isinstance(items, range):  # a range travels as three numbers
            items = list(items)
        if not items:
            return []
        with self._lock:
            if self._closed:
                raise PoolClosed("fan_out on a closed pool")
            tids = [next(self._ids) for _ in items]  # consecutive: the worker counts from the first
            self._last_tid = tids[-1]
            futs = [PoolFuture() for _ in tids]
            self._pending.update(zip(tids, futs, strict=True))
        try:
            from .worker import fan_out

            head = self.submit(fan_out, tids[0], fn, items, priority, priority=priority)
        except BaseException:
            with self._lock:
                for tid in tids:
                    self._pending.pop(tid, None)
            raise

        def failed(head: Future) -> None:  # calls never queued cannot complete: fail them
            exc = head.exception() if not head.cancelled() else PoolClosed("fan_out cancelled")
            if exc is None:
                return
            with self._lock:
                lost = [f for t in tids if (f := self._pending.pop(t, None)) is not None]
            for f in lost:
                complete(f, False, exc)

        head.add_done_callback(failed)
        return futs

    def steal_latencies_ns(self) -> list[int]:
        """The newest steal latencies reported by the workers (and forget them): each from
        a worker's look for work, its own ring and the global one empty, to a stolen task
        in hand."""
        with self._lock:
            out = list(self._steal_ns)
            self._steal_ns.clear()
        return out

    # -- collecting ------------------------------------------------------------------
    def _collect(self) -> None:
        r, q = self._r, SharedQueues.attach(self._q.fd)  # this thread's own objects
        last = time.monotonic()
        try:
            while not self._stop:
                got = self._drain(r)
                if time.monotonic() - last >= POLL:
                    self._check_workers(r, q)
                    last = time.monotonic()
                if not got:
                    r.wait(0, POLL)
        finally:
            q.close()

    def _drain(self, r) -> int:
        n = 0
        routed = []  # clients' outcomes
        while (blob := r.pop_global()) is not None:
            n += 1
            done = []
            with self._lock:
                for raw in pickle.loads(blob):
                    msg = pickle.loads(raw)
                    if msg[0] == "ready":
                        self.workers[msg[1]].ready = True
                        self.workers[msg[1]].preempt = msg[3]
                        if all(w.ready for w in self.workers):
                            self._ready.set()
                    elif msg[0] == "stats":
                        w = self.workers[msg[1]]
                        w.contexts = msg[2]
                        w.context_pool = msg[4]
                        w.steals += len(msg[3])
                        self._steal_ns.extend(msg[3])
                    elif msg[0] == "claim":
                        w = self.workers[msg[1]]
                        for tid in msg[2]:
                            if tid in self._pending or tid >= CLIENT_BASE:
                                self._claims[tid] = w.index
                                w.claimed.add(tid)
                    elif msg[0] == "done":  # [(tid, ok, value), ...]
                        claims, pending, workers = self._claims, self._pending, self.workers
                        for item in msg[1]:
                            tid = item[0]
                            wi = claims.pop(tid, None)
                            if wi is not None:
                                workers[wi].claimed.discard(tid)
                                workers[wi].done += 1
                            if tid >= CLIENT_BASE:
                                routed.append(item)  # its value still sealed: see clients.py
                            elif (fut := pending.pop(tid, None)) is not None:
                                done.append((fut, item[1], item[2]))
                    elif msg[0] == "ended":  # clients' tasks a worker answered itself
                        w = self.workers[msg[1]]
                        for tid in msg[2]:
                            if self._claims.pop(tid, None) is not None:
                                w.claimed.discard(tid)
                                w.done += 1
                    elif msg[0] == "hello":  # a PoolClient: (pid, its reply region's path)
                        self._relay.hello(msg[1], msg[2])
                    elif msg[0] == "bye":
                        self._relay.bye(msg[1])
            if routed:
                self._relay.route(routed)
                routed = []
            complete_all(done)  # outside the pool's lock: callbacks may submit
        return n

    def _check_workers(self, r, q) -> None:
        self._follow_cpus()
        for w in self.workers:
            if w.alive and w.proc.poll() is not None:
                w.alive = False
                self._drain(r)  # what it sent before it died counts
                if w.retiring:
                    self._retired(w, q)
                    continue
                if not w.ready:
                    self._ready.set()  # __init__ stops waiting and reports it
                self._lost(w, q)
        self._relay.check()
        if not any(w.alive or w.retiring for w in self.workers):
            self._fail_all(WorkerLost("every worker of the pool has died"))
        elif self._deaths:
            self._reconcile(r, q)

    def _follow_cpus(self) -> None:
        """The workers follow the CPUs this process may use, its CPU affinity (a cpuset
        shrunk or a CPU taken offline changes it; so does the owner narrowing its own): a
        worker whose CPU left is retired (SIGTERM: it finishes the batch it runs, and what
        is queued on its ring goes back to the others when it has exited); one whose CPU
        came back is started again, on the same ring. A pool never grows past the CPUs it
        was made for."""
        try:
            allowed = os.sched_getaffinity(os.getpid())  # the process's, not this thread's
        except OSError:
            return
        for w in list(self.workers):
            if w.alive and not w.retiring and w.cpu not in allowed:
                w.retiring = True
                w.proc.terminate()
                self._q.wake(w.index)
            elif w.retiring and not w.alive and w.cpu in allowed and not self._stop:
                fresh = self._spawn(w.index)
                with self._lock:
                    self.workers[w.index] = fresh

    def _retired(self, w: _Worker, q) -> None:
        """A retired worker has exited: anything it still held fails as lost (it finishes
        its batch before it exits, so normally nothing), its ring goes back to the others."""
        if self._preempter is not None:
            self._preempter.disarm(w.pid)
        q.wake(w.index)
        self._fail_claimed(w, "was retired (its CPU left the allowed set)")
        self._requeue(w, q)

    def _reconcile(self, r, q) -> None:
        """A worker killed between taking tasks off a ring and sending their claim leaves
        futures that no ring and no worker holds. After a death, once the pool is quiet at
        two polls in a row (every live worker asleep, every ring empty, nothing claimed,
        the same futures pending), the futures still pending can only be those. The
        clients are told too, with the time of the first quiet poll: a task of theirs
        pushed before it and still pending can only be such a task (runtime.clients)."""
        now = time.monotonic()  # before the look: a push seen done before `now` is in it
        self._drain(r)
        local, glob = q.lengths()
        live = sum(w.alive for w in self.workers)
        with self._lock:
            idle = not glob and not any(local) and not self._claims and q.sleepers() == live
            owed = len(self._deaths) > self._deaths_told and bool(self._relay.clients)
            quiet = idle and (bool(self._pending) or owed)
            mark = (self._last_tid, frozenset(self._pending), len(self._deaths)) if quiet else None
        if mark is None or mark != self._quiet_mark:
            self._quiet_mark, self._quiet_at = mark, now
            return
        self._quiet_mark = None
        deaths = "; ".join(self._deaths)
        why = (
            f"a worker that died after taking it off the queues and before reporting it ({deaths})"
        )
        if owed:
            self._relay.quiet_loss(self._quiet_at, why)
            self._deaths_told = len(self._deaths)
        self._fail_all(lambda tid: WorkerLost(f"task {tid} was lost with {why}"))

    def _lost(self, w: _Worker, q) -> None:
        code = w.proc.returncode
        how = f"died with signal {-code}" if code < 0 else f"exited with status {code}"
        self._deaths.append(f"{w.describe()} {how}")
        if self._preempter is not None:
            self._preempter.disarm(w.pid)
        q.wake(w.index)  # clears its sleeper flag if it died asleep: `sleepers()` counts live ones
        self._fail_claimed(w, how)
        self._requeue(w, q)

    def _fail_claimed(self, w: _Worker, how: str) -> None:
        with self._lock:
            lost = sorted(w.claimed)
            w.claimed.clear()
            futs = [(t, self._pending.pop(t, None)) for t in lost]
            for t in lost:
                self._claims.pop(t, None)
        theirs = []
        for tid, fut in futs:
            msg = f"{w.describe()} {how} while running task {tid} (or holding it, claimed)"
            if fut is not None:
                complete(fut, False, WorkerLost(msg))
            elif tid >= CLIENT_BASE:
                theirs.append((tid, WorkerLost(msg)))
        self._relay.lost(theirs)

    def _requeue(self, w: _Worker, q) -> None:
        """Its queued tasks go back to the global ring: stolen onto the owner's ring (the
        exited worker writes nothing now) and popped from there."""
        mine = len(self.workers)
        while q.steal(mine, w.index):
            while (blob := q.pop_local(mine)) is not None:
                while not q.push_global(blob):
                    time.sleep(0.001)

    def _fail_all(self, exc_for) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            self._claims.clear()
            for w in self.workers:
                w.claimed.clear()
        for tid, fut in pending.items():
            exc = exc_for(tid) if callable(exc_for) else exc_for
            complete(fut, False, exc)

    # -- the rest --------------------------------------------------------------------
    def stats(self) -> dict:
        local, glob = self._q.lengths()
        with self._lock:
            pending = len(self._pending)
        return {
            "global": glob,
            "pending": pending,
            "workers": [
                {
                    "index": w.index,
                    "cpu": w.cpu,
                    "pid": w.pid,
                    "alive": w.alive,
                    "retiring": w.retiring,  # with alive False: retired
                    "queued": local[w.index],
                    "running": len(w.claimed),
                    "done": w.done,
                    "preempt": w.preempt,
                    "contexts": w.contexts,
                    **_context_pool(w.context_pool),
                    "steals": w.steals,
                }
                for w in self.workers
            ],
        }

    def close(self, timeout: float = 5.0) -> None:
        """Stop the workers (SIGTERM, then SIGKILL after `timeout`); tasks whose results have
        not come back fail with PoolClosed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop = True
        self._r.wake(0)
        self._collector.join()
        self._drain(self._r)  # results that came in meanwhile still count
        self._fail_all(lambda tid: PoolClosed(f"the pool was closed before task {tid} ended"))
        self._relay.close()  # each client fails what it still waits for
        self._stop_workers(timeout)
        self._release()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _context_pool(figures) -> dict:
    """A worker's last reported context and preemption figures (None before its first)."""
    live, cap, changes, free, blocked, slices, preempted = figures or (None,) * 7
    running = None if live is None else live - free - blocked
    return {
        "contexts_live": live,
        "contexts_cap": cap,
        "autoscale_changes": changes,
        "contexts_free": free,  # Idle or Reused: in the free list
        "contexts_running": running,  # bound to a task that runs or is runnable
        "contexts_blocked": blocked,  # bound to a parked task
        "preempt_signals": slices or 0,  # time-slice signals the worker saw
        "preemptions": preempted or 0,  # of those, the ones that switched tasks
    }


def _chunk(fn, items):
    return [fn(x) for x in items]
