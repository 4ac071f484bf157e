"""A task's handle: a `concurrent.futures.Future` that the runtime's scheduler completes.

It is a real Future subclass (isinstance, `concurrent.futures.wait`/`as_completed`,
`asyncio.wrap_future` all accept it) that skips Future.__init__: a Future makes a
threading.Condition (a lock and two lists) up front, which costs more than a whole trivial
task. Here the Condition, the waiter list and the callback list are made on first use, by
a thread that waits or a caller that adds a callback; a handle nobody waits on from outside
never has one.

Why that is safe against a thread that waits while the scheduler completes the task:
`_finish` writes the state first and only then looks for a Condition. A waiter makes the
Condition and then reads the state under it. If the waiter read the state before it was
written, its Condition existed before `_finish` looked, so `_finish` notifies under it; if
after, the waiter sees the task done and does not wait. (Under the GIL these reads and
writes are ordered as written.)
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
    RUNNING,
)

from xhagent._sched import TaskBase

__all__ = ["Cancelled", "LazyFuture", "MAKE_CONDITION", "TaskHandle", "Trap"]

_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
# Taken to make any LazyFuture's Condition (and by the pool's collector to complete futures
# that have none: so a future is completed without its lock only while nobody can wait).
MAKE_CONDITION = threading.Lock()


class Cancelled(BaseException):
    """Raised inside a task at its next switch point once it is cancelled.

    A BaseException, as in asyncio and trio, so that `except Exception` in a task does not
    swallow its cancellation; a task that lets it escape ends cancelled."""


class Trap:
    """What a runtime awaitable yields to the worker that drives an `async def` task:
    a blocking runtime call to make on the coroutine's behalf (`fn(*args)`), whose return
    value or exception is sent back into the coroutine."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __await__(self):
        return (yield self)


class LazyFuture(Future):
    """A concurrent.futures.Future whose Condition and lists are made on first use (a
    thread that waits, adds a callback or cancels): Future.__init__ makes a Condition, two
    lists and a deque, which cost more than the rest of a spawn or a submit and, thousands
    in flight, most of the garbage collector's time. Subclasses do not call
    Future.__init__; the fields start as these class defaults."""

    _cond = None  # the Condition, once someone waits
    _wts = None  # concurrent.futures waiters
    _cbs = None  # done callbacks
    _result = None
    _exception = None
    _state = PENDING

    def result(self, timeout: float | None = None):
        # Done with a result: no lock to take. The outcome is written before the state
        # (complete_all, _finish), so a FINISHED read here sees it. Future.result would make
        # the Condition this class defers, and take it, for an outcome already in hand.
        if self._state is FINISHED and self._exception is None:
            return self._result
        return Future.result(self, timeout)

    @property
    def _condition(self):
        cond = self._cond
        if cond is None:
            with MAKE_CONDITION:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
        return cond

    @property
    def _waiters(self):
        if self._wts is None:
            self._wts = []
        return self._wts

    @property
    def _done_callbacks(self):
        if self._cbs is None:
            self._cbs = []
        return self._cbs


class TaskHandle(TaskBase, LazyFuture):
    """A spawned task: its outcome, its cancellation, and what the scheduler keeps on it.

    The fields a yield or a hand-over reads (`_g`, `_ctx`, `_coro`, `_local`,
    `_cancel_requested`, `_preempt_requested`) are its C base's (native/sched.c), read
    there without an attribute lookup. Rarely set fields are
    class attributes, so a spawn writes five instance attributes
    (the scheduler makes handles without calling __init__, writing the same five in the
    same order). Every field's name is in the class's shared key table before the first
    real handle exists (see prime_instance_keys)."""

    # _ctx (TaskBase): the Context it runs on, from its first step to its end (a coroutine
    # task's between steps: see the scheduler)
    # _g (TaskBase): its context's greenlet (what a switch to it needs, one object nearer)
    _joiners = None  # [(task, park token)] parked on this task's end
    # _cancel_requested, _preempt_requested (TaskBase): False until asked
    _parks = 0  # park token: counts this task's parks, so a stale wake-up is recognised
    _wake_exc = None  # what to raise in the task when it resumes from a park
    _critical = 0  # depth of critical() sections

    def __init__(self, sched, fn, args, priority, deadline):
        self._sched = sched
        self.fn = fn
        self.args = args
        self.priority = priority
        self.deadline = deadline

    def _finish(self, state, result, exc) -> None:
        """Record the outcome (the scheduler's thread). See the module note on ordering."""
        self._result, self._exception = result, exc
        self._state = state
        if self._cond is not None:
            self._notify()

    def _notify(self) -> None:
        """The outcome is written: wake the threads waiting and run the callbacks."""
        state, exc = self._state, self._exception
        with self._cond:
            for waiter in self._wts or ():
                if state is not FINISHED:
                    waiter.add_cancelled(self)
                elif exc is not None:
                    waiter.add_exception(self)
                else:
                    waiter.add_result(self)
            self._cond.notify_all()
        self._invoke_callbacks()

    # -- the Future API --------------------------------------------------------------
    def cancel(self) -> bool:
        """Cancel the task: at once if it has not started, at its next switch point if it
        has (a parked task is woken to take it). False if it has already ended."""
        return self._sched.cancel(self)

    def running(self) -> bool:
        return self._state is RUNNING

    def _outcome(self):
        if self._state is not FINISHED:
            raise CancelledError()
        if self._exception is not None:
            raise self._exception
        return self._result

    def join(self, timeout: float | None = None):
        """Inside a task: park until this task ends, then its result (or its exception,
        or CancelledError). Elsewhere: wait as Future.result does."""
        if self._state is FINISHED and self._exception is None:
            return self._result  # the common case first: done, with a result
        if self._state not in _DONE:
            if not self._sched.wait_for(self, timeout):
                return super().result(timeout)
        return self._outcome()

    result = join

    def exception(self, timeout: float | None = None):
        if self._state not in _DONE and not self._sched.wait_for(self, timeout):
            return super().exception(timeout)
        if self._state is not FINISHED:
            raise CancelledError()
        return self._exception

    def __await__(self):
        return (yield Trap(self.join))

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", self.fn)
        return f"<TaskHandle {name} class={self.priority} deadline={self.deadline} {self._state}>"


def prime_instance_keys(cls, first: tuple[str, ...] = ()) -> None:
    """Put the names of `cls`'s instance fields (`first`, then its class-level defaults) in
    the key table its instances share, by writing them all on one throwaway instance.

    CPython 3.11 shrinks the room left in that table by one per instance made: a name first
    written after a few dozen instances exist (a task's `_result`, written when it ends,
    thousands of spawns later) no longer fits, and every instance that writes it gets a
    dict of its own: an allocation the collector tracks, per task."""
    fields = dict.fromkeys(first)
    for klass in reversed(cls.__mro__[:-1]):
        for name, value in vars(klass).items():
            if not name.startswith("__") and not callable(value) and not hasattr(value, "__get__"):
                fields[name] = None
    probe = cls.__new__(cls)
    for name in fields:
        object.__setattr__(probe, name, None)


prime_instance_keys(TaskHandle, ("_sched", "fn", "args", "priority", "deadline"))
