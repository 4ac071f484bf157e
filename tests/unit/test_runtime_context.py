"""Reusable contexts: the state table, reuse across many tasks, storage cleared, idle trim."""

import itertools

import pytest
from greenlet import getcurrent

from xhagent.runtime.context import (
    TRANSITIONS,
    Context,
    ContextPool,
    ContextState,
    IllegalTransition,
    check,
)

S = ContextState
LEGAL = {
    (S.IDLE, S.RUNNING),
    (S.RUNNING, S.BLOCKED),
    (S.BLOCKED, S.RUNNING),
    (S.RUNNING, S.REUSED),
    (S.REUSED, S.RUNNING),
}


@pytest.mark.parametrize("old,new", list(itertools.product(S, S)))
def test_every_pair_of_states_against_the_table(old, new):
    if (old, new) in LEGAL:
        check(old, new)
    else:
        with pytest.raises(IllegalTransition, match=f"{old.name} -> {new.name}"):
            check(old, new)


def test_the_table_is_exactly_the_documented_one():
    assert {(o, n) for o, nexts in TRANSITIONS.items() for n in nexts} == LEGAL


class Driver:
    """Runs tasks on a pool from the test's greenlet: a task is a callable taking its
    context; the outcome of each is recorded."""

    def __init__(self, **kw):
        self.outcomes = []
        self.pool = ContextPool(self.runner, **kw)

    def runner(self, task):
        try:
            self.outcomes.append(("ok", task(self.ctx)))
        except Exception as exc:
            self.outcomes.append(("error", exc))

    def run(self, task):
        self.ctx = ctx = self.pool.acquire(task)
        assert ctx is not None and ctx.state is S.RUNNING
        ctx.greenlet.switch()  # the context runs it, releases itself, switches home
        assert ctx.state is S.REUSED
        return self.outcomes[-1]


def test_contexts_are_reused_and_no_new_one_is_made_after_warm_up():
    d = Driver(min=2, max=8)
    assert d.pool.created == 2 and len(d.pool.free) == 2
    for _ in range(10):
        d.run(lambda ctx: None)
    created, greenlets = d.pool.created, {id(c.greenlet) for c in d.pool.free}
    for _ in range(100_000):
        d.run(lambda ctx: None)
    assert d.pool.created == created == 2
    assert {id(c.greenlet) for c in d.pool.free} == greenlets
    assert d.pool.reused >= 100_000
    assert sum(c.tasks_run for c in d.pool.free) == 100_010


def test_task_local_storage_is_empty_for_each_new_task():
    d = Driver(min=1, max=1)
    seen = []

    def task(ctx):
        seen.append(dict(ctx.local))
        ctx.local["secret"] = len(seen)
        return ctx.local

    kept = [d.run(task)[1] for _ in range(3)]
    assert seen == [{}, {}, {}]
    # A finished task's reference to its storage is not the next task's storage.
    assert [k["secret"] for k in kept] == [1, 2, 3]
    assert d.pool.created == 1


def test_an_exception_does_not_kill_the_context():
    d = Driver(min=1, max=1)
    first = d.pool.free[0]

    def boom(ctx):
        raise ValueError("task failed")

    kind, exc = d.run(boom)
    assert kind == "error" and isinstance(exc, ValueError)
    assert d.run(lambda ctx: ctx) == ("ok", first)
    assert first.greenlet and not first.greenlet.dead
    assert d.pool.created == 1


def test_acquire_returns_none_at_max_and_grows_up_to_it():
    pool = ContextPool(lambda task: None, min=0, max=2)
    a, b = pool.acquire("a"), pool.acquire("b")
    assert isinstance(a, Context) and isinstance(b, Context) and a is not b
    assert pool.acquire("c") is None
    assert pool.created == pool.live == 2


def test_park_and_unpark_follow_the_table():
    pool = ContextPool(lambda task: None, min=1, max=1)
    ctx = pool.acquire("t")
    pool.park(ctx)
    assert ctx.state is S.BLOCKED and pool.parked == 1 and pool.stats()["blocked"] == 1
    with pytest.raises(IllegalTransition):
        pool.release(ctx)  # a parked task is woken before its context is released
    pool.unpark(ctx)
    assert ctx.state is S.RUNNING
    assert pool.stats()["blocked"] == 0 and pool.parked == 1  # a gauge, and a count of parks


def test_idle_timeout_trims_free_contexts_down_to_min():
    now = [0.0]
    d = Driver(min=1, max=4, idle_timeout=10.0, clock=lambda: now[0])
    held = [d.pool.acquire(f"t{i}") for i in range(4)]
    assert d.pool.live == 4
    for i, ctx in enumerate(held):
        now[0] = float(i)
        d.pool.release(ctx)  # released at 0, 1, 2, 3
    now[0] = 11.5  # the contexts released at 0 and 1 have been idle 10s or more
    assert d.pool.trim() == 2
    assert d.pool.live == 2 and d.pool.trimmed == 2
    assert all(c.greenlet.dead for c in held[:2])
    assert d.pool.trim(now=100.0) == 1  # never below min
    assert d.pool.live == 1
    assert d.run(lambda ctx: "still works") == ("ok", "still works")


def test_contexts_made_from_inside_contexts_do_not_nest():
    # Each context made while another runs would start deeper on the stack without the
    # pool's factory greenlet; 3000 of them nested would exceed the recursion limit.
    made = []
    pool = ContextPool(lambda task: task(), min=0, max=5000)

    def grow(n):
        if n:
            ctx = pool.acquire(lambda: grow(n - 1))
            made.append(ctx)
            ctx.greenlet.switch()

    home = getcurrent()
    pool.switch_away = lambda ctx: home.switch()
    grow(3000)
    assert pool.created == 3000


def test_resize_applies_a_target_within_the_bounds_and_spares_bound_contexts():
    d = Driver(min=2, max=10)
    assert d.pool.resize(6) == 6 and len(d.pool.free) == 6
    assert d.pool.resize(50) == 10
    held = [d.pool.acquire(f"t{i}") for i in range(5)]
    assert d.pool.resize(0) == 5  # the five bound ones stay; min is 2 anyway
    assert len(d.pool.free) == 0 and all(c.state is S.RUNNING for c in held)
    for ctx in held:
        d.pool.release(ctx)
    assert d.pool.resize(0) == 2
    assert d.run(lambda ctx: "ok") == ("ok", "ok")
    assert d.pool.created == 10


@pytest.mark.parametrize(
    "kw", [{"min": -1}, {"max": 0}, {"min": 3, "max": 2}, {"idle_timeout": 0}, {"min": 1.5}]
)
def test_bad_pool_sizes_are_refused(kw):
    with pytest.raises(ValueError):
        ContextPool(lambda task: None, **kw)


def test_a_context_released_without_a_clock_reading_is_idle_from_the_first_trim():
    now = [0.0]
    d = Driver(min=0, max=2, idle_timeout=10.0, clock=lambda: now[0])
    ctx = d.pool.acquire("t")
    d.pool.release(ctx)
    ctx.idle_since = None  # as the scheduler releases: no clock reading per task
    now[0] = 50.0
    assert d.pool.trim() == 0 and ctx.idle_since == 50.0  # kept, and stamped
    now[0] = 59.0
    assert d.pool.trim() == 0
    now[0] = 60.0
    assert d.pool.trim() == 1 and d.pool.live == 0
