"""One worker's scheduler: tasks on reusable contexts, single thread, single process.

Modelled on trio's `_core` run loop, with one difference that pays for itself: a task that
gives up the CPU (yields, parks or ends) picks its successor and switches to it directly,
instead of switching to a hub that then switches again. The decision is still made in
one place, `_next`; the hub (the greenlet that called `run`) only gets control when
nothing is runnable, and then sleeps until the next timer or an outside wake-up.

Invariants (each operation below keeps them):
  * One greenlet runs at a time: the hub, or the context of `self.current`.
  * A live task is in exactly one place: a run queue (runnable), `self.current` (running),
    parked (its context Blocked; a timer, a joiner list or a foreign future may hold a
    wake-up for it), or the context wait list (picked while the pool was at its cap).
  * A plain-function task holds a context from its first step to its end, and only then;
    a queued task that has not started holds none, so cancelling it costs nothing. An
    `async def` task holds one while a step runs and while it is parked; at a yield, when
    the task picked next holds none, it hands its context over to that one and waits in
    its run queue without one (its `_coro` set, its storage in `_local`), to be bound again
    like a fresh task: a run of coroutine tasks that yield to each other runs on one
    context, with no greenlet switch.
  * A wake-up carries the park token it was made for (`task._parks` at park time); one
    whose token is stale, or whose task is no longer Blocked, does nothing. So timers,
    joiner lists and foreign callbacks are never cleaned eagerly.
  * Order: priority class first (0 runs first), then within a class earliest deadline
    first (EDF; tasks without a deadline after every deadline, in FIFO order), with ties
    in the order tasks became runnable. A task that yields goes behind the runnable tasks
    of its class that it ties with.

The run queues, the pick and `yield_` are C (native/sched.c, the `_sched.Core` base): a
yield is one C call and one greenlet switch, with no Python frame and no allocation; the C
hands anything unusual (hooks, a crash, other threads' wake-ups, a due timer, a task's
first step, which binds a context) back to the Python methods here.

The run queues are not `xhagent.sched.queues.ReadyQueue`: that queue files frozen `Job`
records by name in a dict and computes a Python key per push, which costs more than a
whole trivial task here, and it has no O(1) path for the common deadline-less task. The
ordering is the same one (`discipline("edf")`: deadline, none last, then arrival).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures._base import CANCELLED_AND_NOTIFIED, FINISHED, PENDING, RUNNING
from heapq import heappop, heappush
from itertools import count
from types import CoroutineType
from typing import Protocol

from greenlet import GreenletExit, getcurrent

from xhagent import _sched

from .autoscale import ScaleConfig
from .context import ContextPool, ContextState, check
from .scaling import ContextScaler
from .task import Cancelled, TaskHandle, Trap

_sched.configure(Cancelled, PENDING, ContextState.IDLE, ContextState.RUNNING, ContextState.REUSED)
# What `await yield_async()` yields: the C drive (`_drive`) requeues the task without a call.
YIELD = Trap(_sched.yield_)
_sched.configure_coro(Trap, YIELD, RUNNING)

BLOCKED = ContextState.BLOCKED
IDLE, RUNNING_CTX, REUSED = ContextState.IDLE, ContextState.RUNNING, ContextState.REUSED
_new = TaskHandle.__new__  # TaskBase's: no __init__ call
HIGH, NORMAL, LOW = 0, 1, 2
HOOKS = ("task_spawned", "before_task_step", "after_task_step", "task_exited")


class Instrument(Protocol):
    """Any subset of these methods; each gets the TaskHandle. Order for one task:
    task_spawned, then per step before_task_step ... after_task_step, with task_exited
    inside its last step (before its after_task_step), as in trio. A task cancelled
    before it started has no steps: task_spawned, then task_exited. Hooks run inside the
    scheduler's switch path and must not raise."""

    def task_spawned(self, task: TaskHandle) -> None: ...
    def before_task_step(self, task: TaskHandle) -> None: ...
    def after_task_step(self, task: TaskHandle) -> None: ...
    def task_exited(self, task: TaskHandle) -> None: ...


# The scheduler running in this process (a worker process runs one); `api` reads it.
_running: Scheduler | None = None


class Deadlock(RuntimeError):
    """Tasks are parked and nothing (no timer, no foreign future) can wake them."""


class Scheduler(_sched.Core):
    """The run queues, `current`, `_next` (the decision: `_next_slow` for what needs
    Python, else `_pick`), `_ready` (queue a task), `runnable_class` and `yield_` are the C
    base's (native/sched.c); this class keeps everything else."""

    def __init__(
        self,
        *,
        classes: int = 3,
        pool_min: int = 0,
        pool_max: int = 65536,
        idle_timeout: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        instruments: Iterable[object] = (),
        scale: ScaleConfig | None = None,
    ):
        """`pool_min`/`pool_max`/`idle_timeout`: the context pool's (ContextPool). With
        `scale`, its min and max replace pool_min and pool_max and the number of contexts
        bound at once follows it (runtime.scaling)."""
        if classes < 1:
            raise ValueError(f"need at least one priority class, not {classes}")
        # Per class: a heap of (deadline, seq, task) and a FIFO of deadline-less tasks, in C.
        self._setup_queues(classes)
        self.classes = classes
        self._seq = count()
        self._timers: list[list] = []  # heap of [when, seq, task, token, exception or None]
        self._external: deque = deque()  # (task, token) woken from other threads
        self._wakeup = threading.Event()
        self._ctx_wait: deque[TaskHandle] = deque()
        self._foreign = 0  # tasks parked on futures that other threads complete
        self._io = None  # the tasks' io_uring ring (runtime.io), made by their first read/write
        self._alive = 0
        self._crash: BaseException | None = None
        self.clock = clock
        self.current: TaskHandle | None = None
        self.pool: ContextPool | None = None
        if scale is not None:
            pool_min, pool_max = scale.min, scale.max
        self._pool_args = (pool_min, pool_max, idle_timeout)
        self._scale = scale
        self._scaler: ContextScaler | None = None
        self._hub = None
        self._thread = None
        self._hooks: dict[str, list] = {h: [] for h in HOOKS}
        self._instrumented = False
        for inst in instruments:
            self.add_instrument(inst)

    def add_instrument(self, inst) -> None:
        for hook in HOOKS:
            if callable(getattr(inst, hook, None)):
                self._hooks[hook].append(getattr(inst, hook))
        self._instrumented = any(self._hooks.values())

    def _call(self, hook: str, task: TaskHandle) -> None:
        for fn in self._hooks[hook]:
            fn(task)

    # -- the run queues (C: _ready, _pick, runnable_class) ------------------------------
    def _next_slow(self):
        """The scheduling decision when the C `_next` needs Python: instruments' hooks, a
        crashed run, wake-ups from other threads, a due timer (or a clock in Python). The
        greenlet to run next (the hub if none).

        Order (`_pick`): class 0 first; in a class, the deadline heap (EDF) before the FIFO
        of deadline-less tasks."""
        if self._instrumented and self.current is not None:
            self._call("after_task_step", self.current)
        timers = self._timers
        if timers and timers[0][0] <= self.clock():
            self._fire_timers()
        if self._external:
            self._drain_external()
        if self._crash is None:
            g = self._pick()
            if self._instrumented and self.current is not None:
                self._call("before_task_step", self.current)
            return g
        self.current = None
        return self._hub

    def _wait_for_context(self, task: TaskHandle) -> None:
        """`_pick` found the pool at its cap: the task waits for a released context."""
        self._ctx_wait.append(task)
        if self._scaler is not None:
            self._scaler.waiting()

    def _bind(self, task: TaskHandle):
        """Bind a context to `task` (the pool's acquire, its common case inline: a free
        context, most recently used first); its greenlet, or None at the pool's max. `_pick`
        does the common case in C (an Idle or Reused free context) and calls this for the
        rest: a context to make, or a free one in a state the table refuses to bind."""
        free = self._free
        if free:
            ctx = free.pop()
            state = ctx.state
            if state is REUSED:
                self.pool.reused += 1
            elif state is not IDLE:
                check(state, RUNNING_CTX)  # as Context.move: the table decides
            ctx.state = RUNNING_CTX
            ctx.task = task
        else:
            ctx = self.pool.acquire(task)
            if ctx is None:
                return None
        task._ctx = ctx
        g = task._g = ctx.greenlet
        return g

    def _switch_from(self, me) -> None:
        """Switch from greenlet `me` to the next; returns when `me` is picked again. The
        next is often `me` itself (a fresh task bound to the context just released, the
        only runnable task yielding), and a switch to oneself costs 100 ns for nothing."""
        nxt = self._next()
        if nxt is not me:
            nxt.switch()

    # -- running a task (inside its context) --------------------------------------------
    def _serve(self, task: TaskHandle) -> None:
        """The body of every context (its pool's runner): run the bound task, release the
        context (ContextPool.release, inline), pick the next; when that is a fresh task
        bound to this same context, run it here, with no switch and no return through the
        context's loop. Leaves only by GreenletExit (the context is being ended)."""
        ctx = task._ctx
        me = ctx.greenlet
        pool = self.pool
        free = pool.free
        while True:
            # The C _drive may hand this context on at a coroutine's yield: the task whose
            # outcome comes back is then `ctx.task`, read again in each branch below.
            try:
                if task._coro is None:
                    task._state = RUNNING
                    # Without arguments, a plain call: CPython runs a Python callee in the same
                    # C frame, so the context's stack (copied at every greenlet switch) stays short.
                    result = task.fn(*task.args) if task.args else task.fn()
                    if type(result) is CoroutineType:
                        task._coro = result
                        result = self._drive(ctx)
                else:  # a coroutine task bound again after it handed its context on
                    if task._local is not None:
                        ctx.local, task._local = task._local, None
                    result = self._drive(ctx)
            except Cancelled:
                self._exit(ctx.task, CANCELLED_AND_NOTIFIED, None, None)
            except Exception as exc:
                self._exit(ctx.task, FINISHED, None, exc)
            except GreenletExit:
                raise  # the context itself is being ended (a dead run's greenlets collected)
            except BaseException as exc:  # KeyboardInterrupt, SystemExit: the run must stop
                self._exit(ctx.task, FINISHED, None, exc)
                self._crash = exc
            else:
                # _exit's common case inline: a result, nobody waiting from another thread
                task = ctx.task
                task._coro = None
                task._result = result
                task._state = FINISHED
                if task._cond is not None:
                    task._notify()
                if task.args:
                    task.args = ()
                self._alive -= 1
                if task._joiners:
                    self._wake_joiners(task)
                if self._instrumented:
                    self._call("task_exited", task)
            # The release: the move Running -> Reused is checked as Context.move checks it.
            if ctx.state is not RUNNING_CTX:
                check(ctx.state, REUSED)
            ctx.state = REUSED
            ctx.task = None
            ctx.tasks_run += 1
            if ctx.local:
                ctx.local = {}  # a new dict: see ContextPool.release
            ctx.idle_since = None  # a clock reading per task costs 5%: trim stamps it
            free.append(ctx)
            if self._ctx_wait:
                self._hand_over()
            nxt = self._next()
            if nxt is not me:
                nxt.switch()  # back when a task is bound to this context again
            task = ctx.task

    def _hand_over(self) -> None:
        """A context was just released: bind it to a task that found the pool full."""
        self._bind_waiting()
        if self._scaler is not None:
            self._scaler.tick(self)

    def _bind_waiting(self) -> None:
        """Bind free contexts (or make them, under the cap) to waiting tasks, oldest first."""
        wait, scaler = self._ctx_wait, self._scaler
        while wait:
            task = wait[0]
            # a fresh task, or a coroutine task waiting without a context (its _coro set)
            waits = task._state is PENDING or task._coro is not None
            if waits and self._bind(task) is None:
                return  # the cap (or max) is reached
            wait.popleft()
            if scaler is not None:
                scaler.left()
            if waits:
                self._ready(task)

    def await_in_task(self, coro):
        """Run coroutine `coro` to its end inside the current task (a plain-function task
        that got one, e.g. a pool task whose function is `async def`): each Trap it awaits
        is a blocking call made here, a yield included. Tasks spawned with an `async def`
        function are driven by the C `_drive` instead."""
        value = exc = None
        while True:
            try:
                trap = coro.send(value) if exc is None else coro.throw(exc)
            except StopIteration as stop:
                return stop.value
            value = exc = None
            if type(trap) is not Trap:
                exc = TypeError(f"runtime tasks can await only runtime awaitables, not {trap!r}")
                continue
            try:
                value = trap.fn(*trap.args)
            except BaseException as e:  # handed to the coroutine, which may handle it
                exc = e

    def _exit(self, task: TaskHandle, state: str, result, exc) -> None:
        task._finish(state, result, exc)
        task.args = ()
        task._coro = None
        self._alive -= 1
        if task._joiners:
            self._wake_joiners(task)
        if self._instrumented:
            self._call("task_exited", task)

    def _wake_joiners(self, task: TaskHandle) -> None:
        joiners, task._joiners = task._joiners, None
        for waiter, token in joiners:
            self._wake(waiter, token)

    # -- parking and waking ----------------------------------------------------------------
    def _park(self, register=None, timeout=None, timeout_exc=None) -> None:
        """Park the current task until woken; raise what the wake-up carries.

        `register(task, token)` files the wake-up with whatever will deliver it; it is
        called only once the park is certain (a cancelled task does not park), so no
        wake-up is ever filed under a token the task might use for a later park."""
        task = self.current
        if timeout is not None and timeout != timeout:  # NaN: a timer that never comes due
            raise ValueError("a timeout must be a number of seconds, not NaN")
        if task._cancel_requested:
            raise Cancelled()
        task._parks += 1
        if register is not None:
            register(task, task._parks)
        self.pool.park(task._ctx)
        if timeout is not None:
            entry = [self.clock() + timeout, next(self._seq), task, task._parks, timeout_exc]
            heappush(self._timers, entry)
        self._switch_from(task._ctx.greenlet)
        exc = task._wake_exc
        if exc is not None:
            task._wake_exc = None
            raise exc

    def _wake(self, task: TaskHandle, token: int, exc: BaseException | None = None) -> None:
        ctx = task._ctx
        if task._parks != token or ctx is None or ctx.state is not BLOCKED:
            return  # stale: the task was woken already, and may be parked on something else
        self.pool.unpark(ctx)
        task._wake_exc = exc
        self._ready(task)

    def _fire_timers(self) -> None:
        now, timers = self.clock(), self._timers
        while timers and timers[0][0] <= now:
            _, _, task, token, exc = heappop(timers)
            self._wake(task, token, exc)

    def _drain_external(self) -> None:
        while self._external:
            self._wake(*self._external.popleft())

    # -- the loop --------------------------------------------------------------------------
    def run(self, fn, *args):
        """Run `fn(*args)` as the first task and every task it spawns, until all have ended;
        return its result (or raise its exception)."""
        global _running
        if _running is not None:
            raise RuntimeError("a scheduler is already running in this process")
        _running = self
        _sched.set_running(self)
        self._hub, self._thread = getcurrent(), threading.get_ident()
        pmin, pmax, idle = self._pool_args
        self.pool = ContextPool(
            self._serve,
            min=pmin,
            max=pmax,
            idle_timeout=idle,
            clock=self.clock,
        )
        if self._scale is None:
            self._free = self.pool.free
        else:
            # No free list for the C bind, which does not know the cap: every first step
            # binds through _bind and the pool's acquire.
            self._free = None
            self.pool.resize(max(1, pmin))
            self._scaler = ContextScaler(self._scale, self.clock)
        try:
            main = self.spawn(fn, *args)
            while self._alive:
                self._wakeup.clear()  # before looking, so a wake-up after the look is kept
                nxt = self._next()
                if nxt is not self._hub:
                    nxt.switch()  # back here when nothing is runnable
                    continue
                if self._crash is not None:
                    raise self._crash
                self._idle()
            if self._crash is not None:  # the task that crashed was the last one
                raise self._crash
            return main.result()
        finally:
            _running = None
            _sched.set_running(None)
            if self._io is not None:
                self._io.close()
                self._io = None

    def _idle(self) -> None:
        """Nothing runnable: sleep until the next timer or an outside wake-up (or, with I/O
        in flight, a completion: the sleep is then on the ring)."""
        if self._scaler is not None:
            self._scaler.tick(self)  # tasks waiting for a context while nothing runs: grow
            if self.runnable_class() is not None:
                return
        self.pool.trim()
        io = self._io
        if io is not None and io.inflight:
            io.sleep(max(0.0, self._timers[0][0] - self.clock()) if self._timers else None)
        elif self._timers:
            self._wakeup.wait(max(0.0, self._timers[0][0] - self.clock()))
        elif self._foreign:
            self._wakeup.wait()
        else:
            raise Deadlock(f"{self._alive} tasks are parked and nothing can wake them")

    def scale_tick(self) -> None:
        """Let the autoscaler look now (a cheap clock check between its observations); a
        task that loops without idling the scheduler (a pool worker's feeder) calls it."""
        if self._scaler is not None:
            self._scaler.tick(self)

    # -- what tasks call ---------------------------------------------------------------------
    def spawn(self, fn, *args, priority: int = NORMAL, deadline: float | None = None):
        """Queue `fn(*args)` (a function, or an `async def` function) as a task.
        `priority` is its class (0 first); `deadline` is absolute, on `self.clock`."""
        return self._spawn(fn, args, priority, deadline)

    def _spawn(self, fn, args: tuple, priority: int, deadline: float | None) -> TaskHandle:
        # Positional, so the module-level spawn reaches it with a plain call (CPython
        # inlines those; a call with *args and keywords goes through C).
        if type(priority) is not int or not 0 <= priority < self.classes:
            raise ValueError(f"priority class {priority!r} is not in 0..{self.classes - 1}")
        if deadline is not None and (
            type(deadline) not in (int, float) or deadline != deadline  # NaN never orders
        ):
            raise ValueError(f"deadline must be a number on the scheduler's clock: {deadline!r}")
        # TaskHandle.__init__'s writes, in its order (the instances share one key table), without
        # the call: constructing through type() costs more than the rest of a spawn.
        task = _new(TaskHandle)
        task._sched = self
        task.fn = fn
        task.args = args
        task.priority = priority
        task.deadline = deadline
        self._alive += 1
        self._push(task, priority, deadline)
        if self._instrumented:
            self._call("task_spawned", task)
        return task

    def _in_task(self) -> TaskHandle:
        task = self.current
        if task is None or threading.get_ident() != self._thread:
            raise RuntimeError("this runtime call is made only inside a task")
        return task

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return self.yield_()
        self._in_task()
        self._park(timeout=seconds)

    def wait_for(self, handle: TaskHandle, timeout: float | None = None) -> bool:
        """Park the current task until `handle` ends (TimeoutError after `timeout`).
        False, doing nothing, when not called inside a task of this scheduler's thread."""
        task = self.current
        if task is None or threading.get_ident() != self._thread:
            return False
        if task is handle:
            raise RuntimeError("a task cannot wait for itself")
        if handle._joiners is None:
            handle._joiners = []
        self._park(
            lambda task, token: handle._joiners.append((task, token)),
            timeout,
            TimeoutError(f"{handle!r} did not end within {timeout}s"),
        )
        return True

    def wait_future(self, fut, timeout: float | None = None):
        """Park the current task until `fut` (any concurrent.futures.Future, completed by
        any thread) is done; its result."""
        self._in_task()
        if not fut.done():

            def register(task, token):
                def woken(_):  # in whichever thread completes `fut`
                    self._external.append((task, token))
                    self._wakeup.set()

                fut.add_done_callback(woken)

            self._foreign += 1
            try:
                self._park(register, timeout, TimeoutError(f"{fut!r} not done within {timeout}s"))
            finally:
                self._foreign -= 1
        return fut.result(0)

    def cancel(self, task: TaskHandle) -> bool:
        if task._state not in (PENDING, RUNNING):
            return False
        if threading.get_ident() != self._thread:
            raise RuntimeError("cancel a task from its scheduler's thread")
        if task._ctx is None and task._coro is None:  # never ran: ends now (its entry is skipped)
            self._exit(task, CANCELLED_AND_NOTIFIED, None, None)
            return True
        task._cancel_requested = True
        self._wake(task, task._parks, Cancelled())  # parked: woken to take it; else a no-op
        return True

    def request_preempt(self) -> bool:
        """What the preemption handler calls at a safe point: yield now, or, inside a
        critical() section, remember the request for the section's end. True if yielded."""
        task = self.current
        if task is None:
            return False
        if task._critical:
            task._preempt_requested = True
            return False
        self.yield_()
        return True
