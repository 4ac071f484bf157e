"""Reusable task contexts (the seed's ReusableCtx) and the pool that keeps them.

A Context is a greenlet whose body is a loop: wait for a task, run it, release itself to
the pool's free list, wait again. The greenlet, and so its C stack slice and frame, is made
once and serves many tasks; a task never gets a stack of its own. Task-local storage
(`Context.local`) belongs to the task of the moment and is dropped when the context is
released, so the next task starts with none.

The states, and the only moves between them (TRANSITIONS is the one table; `check` is the
one place that enforces it):

    Idle     created (pre-allocated or grown), parked at the top of its loop, no task run yet
    Running  bound to a task that is executing or runnable (a task that yields stays Running:
             the state is about the binding, not about who holds the CPU this instant)
    Blocked  bound to a task parked on something (a timer, another task, a future)
    Reused   between tasks: its last task has ended (returned, raised or was cancelled), its
             storage is dropped and it is back in the free list, greenlet and stack kept

    Idle    -> Running   first task bound
    Running -> Blocked   the task parks
    Blocked -> Running   the task is woken (what it waited for, a timer, or a cancellation)
    Running -> Reused    the task ended; the context is released
    Reused  -> Running   next task bound

Everything else is illegal, self-moves included: a parked task is woken (if only to be
cancelled and run its cleanup) before its context can be released, so Blocked -> Reused is
refused; a used context never becomes fresh again, so Reused -> Idle is refused. A context
trimmed for idleness is not a state: it leaves the pool and its greenlet is ended.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from enum import IntEnum

from greenlet import GreenletExit, getcurrent, greenlet


class ContextState(IntEnum):
    # IntEnum, not Enum: hashing an Enum member runs Python code, and the table is consulted
    # twice per task on the hot path.
    IDLE = 0
    RUNNING = 1
    BLOCKED = 2
    REUSED = 3


S = ContextState
TRANSITIONS: dict[ContextState, frozenset[ContextState]] = {
    S.IDLE: frozenset({S.RUNNING}),
    S.RUNNING: frozenset({S.BLOCKED, S.REUSED}),
    S.BLOCKED: frozenset({S.RUNNING}),
    S.REUSED: frozenset({S.RUNNING}),
}
del S


class IllegalTransition(RuntimeError):
    """A context was asked to move between two states the table does not connect."""


def check(old: ContextState, new: ContextState) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(
            f"context state {old.name} -> {new.name} is not allowed"
            f" (from {old.name}: {', '.join(s.name for s in sorted(TRANSITIONS[old])) or 'none'})"
        )


class Context:
    """One greenlet that runs tasks in turn. `pool.runner(task)` runs a task inside it."""

    __slots__ = ("id", "state", "local", "task", "tasks_run", "idle_since", "greenlet", "_pool")

    def __init__(self, pool: ContextPool, ident: int):
        self.id = ident
        self.state = ContextState.IDLE
        self.local: dict = {}
        self.task = None
        self.tasks_run = 0
        self.idle_since = pool.clock()
        self._pool = pool
        # The parent is the pool's home greenlet: where control lands if the loop ends
        # (a trim ends it with GreenletExit). Starting it at once parks it at the top of its
        # loop, so the first task costs a switch, not a greenlet start.
        self.greenlet = greenlet(self._loop, parent=pool.home)
        self.greenlet.switch(getcurrent())

    def move(self, new: ContextState) -> None:
        if new not in TRANSITIONS[self.state]:  # the table, read here to save a call per move
            check(self.state, new)  # raises, with the message
        self.state = new

    def _loop(self, creator) -> None:
        creator.switch()  # parked until a task is bound and the greenlet switched to
        pool = self._pool
        runner = pool.runner
        while True:
            # The runner reports the task's outcome and does not raise, but for the
            # GreenletExit that ends this context (a trim, or the collection of a dead run).
            runner(self.task)
            pool.release(self)
            pool.switch_away(self)  # returns when the next task has been bound to us

    def __repr__(self) -> str:
        return f"<Context {self.id} {self.state.name} tasks_run={self.tasks_run}>"


class ContextPool:
    """Free contexts, most recently used first (its stack is the one still in cache).

    `min` contexts are made up front and never trimmed; at most `max` exist at once, and at
    most `cap` are bound at once (`max` unless an autoscale target set it: `resize`); a
    free context idle for `idle_timeout` seconds (by `clock`) is ended by `trim`. A
    release may leave `idle_since` None instead of reading the clock (the scheduler does,
    once per task); such a context counts as idle from the first trim that sees it, so it
    is kept longer, never ended sooner.
    `runner(task)` runs one task inside a context and must not raise; `switch_away(ctx)`
    is called inside a context that has just been released and returns once a new task
    is bound to it (the default switches to `home`, the greenlet that made the pool).
    A runner may instead keep the context for good, releasing it and taking the next
    task itself (the scheduler's does, to save the calls per task); it then leaves only
    by the GreenletExit that ends the context.
    """

    def __init__(
        self,
        runner: Callable[[object], None],
        *,
        min: int = 0,
        max: int = 1024,
        idle_timeout: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        switch_away: Callable[[Context], None] | None = None,
    ):
        if not (isinstance(min, int) and isinstance(max, int)) or min < 0 or max < 1:
            raise ValueError(f"pool sizes must be integers, min >= 0 and max >= 1: {min}, {max}")
        if min > max:
            raise ValueError(f"pool min {min} is above its max {max}")
        if not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be positive seconds: {idle_timeout!r}")
        self.min, self.max, self.idle_timeout = min, max, idle_timeout
        self.runner, self.clock = runner, clock
        self.home = getcurrent()
        self.switch_away = switch_away or self._switch_home
        self.free: deque[Context] = deque()
        self.live = 0  # contexts in existence, free or bound
        self.cap = max  # contexts bound at once, at most
        self.created = self.reused = self.parked = self.trimmed = 0
        self.blocked = 0  # bound to a parked task now (`parked` counts every park)
        # Contexts are made in a greenlet of their own, started here, near the bottom of
        # the stack: a greenlet starts with the C stack position and the Python recursion
        # depth of whoever first switches into it, so contexts made by contexts made by
        # contexts would each start deeper (and the thousandth would hit RecursionError).
        self._factory = greenlet(self._factory_loop, parent=self.home)
        self._factory.switch()
        for _ in range(min):
            self.free.append(self._new())

    def _switch_home(self, ctx: Context) -> None:
        self.home.switch()

    def _factory_loop(self) -> None:
        requester = self.home.switch()  # parked until the first request
        while True:
            requester = requester.switch(Context(self, self.created))

    def _new(self) -> Context:
        self.created += 1
        self.live += 1
        return self._factory.switch(getcurrent())

    def acquire(self, task) -> Context | None:
        """A context bound to `task` (Running), or None when `cap` (at most `max`) are bound."""
        if self.live - len(self.free) >= self.cap:
            return None
        if self.free:
            ctx = self.free.pop()
            if ctx.state is ContextState.REUSED:
                self.reused += 1
        elif self.live < self.max:
            ctx = self._new()
        else:
            return None
        ctx.move(ContextState.RUNNING)
        ctx.task = task
        return ctx

    def release(self, ctx: Context) -> None:
        """`ctx`'s task has ended: drop its storage and put it back in the free list."""
        ctx.move(ContextState.REUSED)
        ctx.task = None
        ctx.tasks_run += 1
        if ctx.local:
            # A new dict rather than clear(): a finished task that kept a reference to its
            # storage must not see (or write into) the next task's.
            ctx.local = {}
        ctx.idle_since = self.clock()
        self.free.append(ctx)

    def park(self, ctx: Context) -> None:
        ctx.move(ContextState.BLOCKED)
        self.parked += 1
        self.blocked += 1

    def unpark(self, ctx: Context) -> None:
        ctx.move(ContextState.RUNNING)
        self.blocked -= 1

    def trim(self, now: float | None = None) -> int:
        """End free contexts idle for `idle_timeout` or more, keeping `min` alive.

        Called in the pool's home greenlet. Returns how many were ended."""
        now = self.clock() if now is None else now
        timeout = self.idle_timeout

        def due(ctx: Context) -> bool:
            since = ctx.idle_since
            if since is None:  # released without a clock reading: idle from this look on
                ctx.idle_since = now
                return False
            return now - since >= timeout

        # The free list's left end holds the longest-idle contexts (release appends right).
        return self._end_free(due, self.min)

    def resize(self, target: int) -> int:
        """Apply an autoscale target: at most `target` contexts bound from now on (`cap`);
        make free contexts until `target` exist (at most `max`), or end free ones, longest
        idle first, down to `target` (at least `min`, and at least one context; bound
        contexts are never ended: with more bound than the new cap, no task is bound until
        enough are released). Returns the size reached."""
        target = max(self.min, 1, min(self.max, target))
        self.cap = target
        while self.live < target:
            self.free.append(self._new())  # newest idle_since: the free list stays in order
        self._end_free(lambda ctx: True, target)
        return self.live

    def _end_free(self, due: Callable[[Context], bool], floor: int) -> int:
        ended = 0
        while self.free and self.live > floor and due(self.free[0]):
            ctx = self.free.popleft()
            self.live -= 1
            self.trimmed += 1
            ended += 1
            g = ctx.greenlet
            g.parent = getcurrent()  # its end returns here, whoever trims
            g.throw(GreenletExit)
        return ended

    def stats(self) -> dict[str, int]:
        return {
            "live": self.live,
            "free": len(self.free),
            "cap": self.cap,
            "created": self.created,
            "reused": self.reused,
            "parked": self.parked,
            "blocked": self.blocked,
            "trimmed": self.trimmed,
        }
