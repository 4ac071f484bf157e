"""`async def` tasks hand their context over at a yield (Scheduler's C `_drive`): the order
is the scheduler's as for plain tasks, storage and cancellation follow the task, and a
run of yielding coroutine tasks needs one context, not one each."""

import concurrent.futures as cf
import time

import pytest

from xhagent.runtime import api as rt
from xhagent.runtime import scheduler as core
from xhagent.runtime.scheduler import HIGH, LOW, NORMAL, Scheduler
from xhagent.runtime.task import Cancelled


def _round_robin(make):
    """Three tasks of `make(name, log)` yielding twice each: the order steps ran in."""
    log = []

    def main():
        hs = [rt.spawn(make(n, log)) for n in "abc"]
        for h in hs:
            h.join()

    rt.run(main)
    return log


def test_coroutine_tasks_take_turns_in_the_order_plain_tasks_do():
    def plain(name, log):
        def body():
            for i in range(3):
                log.append(f"{name}{i}")
                if i < 2:
                    rt.yield_()

        return body

    def coro(name, log):
        async def body():
            for i in range(3):
                log.append(f"{name}{i}")
                if i < 2:
                    await rt.yield_async()

        return body

    expected = ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2"]
    assert _round_robin(plain) == expected
    assert _round_robin(coro) == expected


def test_a_run_of_yielding_coroutine_tasks_runs_on_one_context():
    def main():
        async def body(i):
            for _ in range(5):
                await rt.yield_async()
            return i

        hs = [rt.spawn(body, i) for i in range(2000)]
        return [h.join() for h in hs], core._running.pool.created

    s = Scheduler()
    results, created = s.run(main)
    assert results == list(range(2000))
    # main's context and one the coroutines pass round; plain tasks would need 2001
    assert created <= 3


def test_priority_and_deadlines_hold_across_hand_overs():
    order = []

    async def step(name, n):
        for i in range(n):
            order.append(f"{name}{i}")
            await rt.yield_async()

    def main():
        now = time.monotonic()
        rt.spawn(step, "n", 2, priority=NORMAL)
        rt.spawn(step, "late", 2, priority=NORMAL, deadline=now + 9)
        rt.spawn(step, "early", 2, priority=NORMAL, deadline=now + 1)
        rt.spawn(step, "h", 2, priority=HIGH)
        rt.spawn(step, "l", 1, priority=LOW)

    rt.run(main)
    # HIGH to its end first; in NORMAL the deadlines by EDF, each yield going behind its ties
    assert order == ["h0", "h1", "early0", "early1", "late0", "late1", "n0", "n1", "l0"]


def test_task_local_storage_follows_the_task_not_the_context():
    seen = {}

    async def body(name):
        rt.local()["me"] = name
        for _ in range(4):
            await rt.yield_async()
            assert rt.local().get("me") == name
        seen[name] = rt.local()["me"]

    async def bare():
        for _ in range(4):
            await rt.yield_async()
            assert "me" not in rt.local()  # never sees another task's storage

    def main():
        hs = [rt.spawn(body, n) for n in ("x", "y", "z")] + [rt.spawn(bare)]
        for h in hs:
            h.join()

    rt.run(main)
    assert seen == {"x": "x", "y": "y", "z": "z"}


def test_cancelling_a_coroutine_task_waiting_without_a_context_runs_its_cleanup():
    trace = []

    async def loop():
        try:
            while True:
                await rt.yield_async()
        except Cancelled:
            trace.append("cleanup")
            raise

    async def canceller(h):
        await rt.yield_async()  # `loop` has handed its context on and waits without one
        trace.append((h._ctx is None, h._coro is not None))
        h.cancel()
        trace.append("cancelled")

    def main():
        h = rt.spawn(loop)
        c = rt.spawn(canceller, h)
        c.join()
        with pytest.raises(cf.CancelledError):
            h.join()
        return h.cancelled()

    assert rt.run(main)
    assert trace == [(True, True), "cancelled", "cleanup"]


def test_an_exception_after_hand_overs_ends_the_task_that_raised():
    async def fails(n):
        for _ in range(n):
            await rt.yield_async()
        raise ValueError(f"boom {n}")

    async def fine(n):
        for _ in range(n):
            await rt.yield_async()
        return n

    def main():
        hs = [rt.spawn(fails, 2), rt.spawn(fine, 3), rt.spawn(fails, 1), rt.spawn(fine, 1)]
        out = []
        for h in hs:
            try:
                out.append(h.join())
            except ValueError as e:
                out.append(str(e))
        return out

    assert rt.run(main) == ["boom 2", 3, "boom 1", 1]


def test_plain_and_blocking_tasks_mixed_with_handing_coroutines():
    trace = []

    def plain(name):
        trace.append(f"{name} starts")
        rt.sleep(0.01)  # parks the context it took over
        trace.append(f"{name} ends")
        return name

    async def coro(name):
        await rt.yield_async()
        h = rt.spawn(plain, f"{name}-child")  # fresh: takes this context at the next yield
        await rt.yield_async()
        await rt.sleep_async(0.005)
        return name, await h

    def main():
        hs = [rt.spawn(coro, n) for n in ("a", "b")]
        return [h.join() for h in hs]

    assert rt.run(main) == [("a", "a-child"), ("b", "b-child")]
    assert sorted(trace) == sorted(
        ["a-child starts", "a-child ends", "b-child starts", "b-child ends"]
    )


def test_a_preemption_request_inside_a_coroutine_step_switches_like_a_plain_yield():
    trace = []

    async def spinner():
        for i in range(3):
            trace.append(f"spin{i}")
            rt.request_preempt()  # what the SIGURG handler calls at a safe point

    async def other():
        for i in range(3):
            trace.append(f"other{i}")
            await rt.yield_async()

    def main():
        a, b = rt.spawn(spinner), rt.spawn(other)
        a.join()
        b.join()

    rt.run(main)
    assert trace == ["spin0", "other0", "spin1", "other1", "spin2", "other2"]


def test_hooks_see_every_step_of_coroutine_tasks():
    events = []

    class Recorder:
        def task_spawned(self, t):
            events.append(("spawned", t.fn.__name__))

        def before_task_step(self, t):
            events.append(("before", t.fn.__name__))

        def after_task_step(self, t):
            events.append(("after", t.fn.__name__))

        def task_exited(self, t):
            events.append(("exited", t.fn.__name__))

    async def co():
        await rt.yield_async()

    def main():
        rt.spawn(co).join()

    Scheduler(instruments=[Recorder()]).run(main)
    co_events = [e for e, name in events if name == "co"]
    assert co_events == ["spawned", "before", "after", "before", "exited", "after"]


def test_coroutine_tasks_under_a_context_cap_wait_and_run():
    def main():
        async def body(i):
            for _ in range(3):
                await rt.yield_async()
                await rt.sleep_async(0.001)  # parks with its context: the cap is reached
            return i

        hs = [rt.spawn(body, i) for i in range(20)]
        return [h.join() for h in hs], core._running.pool.created

    results, created = Scheduler(pool_max=4).run(main)
    assert results == list(range(20))
    assert created <= 4


def test_a_nan_sleep_or_timeout_is_refused_not_parked_for_ever():
    async def co():
        await rt.sleep_async(float("nan"))

    def main():
        with pytest.raises(ValueError, match="NaN"):
            rt.sleep(float("nan"))
        h = rt.spawn(co)
        with pytest.raises(ValueError, match="NaN"):
            h.join()
        other = rt.spawn(rt.sleep, 0.01)
        with pytest.raises(ValueError, match="NaN"):
            other.join(float("nan"))
        return other.join()

    assert rt.run(main) is None
