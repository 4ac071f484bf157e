"""The single-thread scheduler: order, yields, timers, joins, cancellation, async tasks,
critical sections, instrumentation, and the Future protocol from other threads."""

import concurrent.futures as cf
import gc
import math
import threading
import time

import pytest

from xhagent.runtime import api as rt
from xhagent.runtime.context import ContextState
from xhagent.runtime.scheduler import HIGH, LOW, NORMAL, Deadlock, Scheduler
from xhagent.runtime.task import Cancelled, TaskHandle


def test_run_returns_the_first_tasks_result():
    assert rt.run(lambda a, b: a + b, 2, 3) == 5


def test_classes_first_then_edf_within_a_class_then_fifo():
    order = []

    def main():
        now = time.monotonic()
        for name, prio, deadline in [
            ("low-late", LOW, now + 2),
            ("normal-none-1", NORMAL, None),
            ("normal-late", NORMAL, now + 9),
            ("high-none", HIGH, None),
            ("normal-early", NORMAL, now + 1),
            ("normal-none-2", NORMAL, None),
            ("high-early", HIGH, now + 5),
            ("low-none", LOW, None),
        ]:
            rt.spawn(order.append, name, priority=prio, deadline=deadline)

    rt.run(main)
    assert order == [
        "high-early",
        "high-none",
        "normal-early",
        "normal-late",
        "normal-none-1",
        "normal-none-2",
        "low-late",
        "low-none",
    ]


def test_yield_is_round_robin_within_a_class():
    trace = []

    def worker(name):
        for i in range(3):
            trace.append((name, i))
            rt.yield_()

    def main():
        for name in "abc":
            rt.spawn(worker, name)

    rt.run(main)
    assert trace == [(n, i) for i in range(3) for n in "abc"]


def test_a_yielding_high_task_keeps_the_cpu_from_a_lower_class():
    trace = []

    def high():
        for i in range(3):
            trace.append(f"high{i}")
            rt.yield_()

    def main():
        rt.spawn(trace.append, "low", priority=LOW)
        rt.spawn(high, priority=HIGH)

    rt.run(main)
    assert trace == ["high0", "high1", "high2", "low"]


def test_sleepers_wake_in_order_of_wake_time():
    woke = []

    def sleeper(name, s):
        rt.sleep(s)
        woke.append(name)

    def main():
        for name, s in [("c", 0.06), ("a", 0.02), ("b", 0.04), ("now", 0)]:
            rt.spawn(sleeper, name, s)

    t0 = time.monotonic()
    rt.run(main)
    assert woke == ["now", "a", "b", "c"]
    assert time.monotonic() - t0 >= 0.06


def test_join_parks_the_waiter_and_the_end_wakes_it():
    trace = []

    def child():
        trace.append("child runs")
        rt.sleep(0.01)
        trace.append("child ends")
        return 42

    def main():
        h = rt.spawn(child)
        trace.append("main joins")
        me = rt.current_task()
        r = h.join()
        assert rt.current_task() is me
        trace.append(f"main got {r}")
        return me._ctx.state

    assert rt.run(main) is ContextState.RUNNING
    assert trace == ["main joins", "child runs", "child ends", "main got 42"]


def test_result_inside_a_task_parks_rather_than_blocking_the_thread():
    def main():
        h = rt.spawn(rt.sleep, 0.01)
        return h.result(), h.done(), h.exception()

    assert rt.run(main) == (None, True, None)


def test_join_with_timeout_raises_timeout_error():
    def main():
        h = rt.spawn(rt.sleep, 0.2)
        with pytest.raises(TimeoutError):
            h.join(timeout=0.01)
        return h.join()

    assert rt.run(main) is None


def test_exceptions_propagate_to_the_future_and_the_run():
    def bad():
        raise KeyError("nope")

    def main():
        h = rt.spawn(bad)
        with pytest.raises(KeyError):
            h.join()
        assert isinstance(h.exception(), KeyError)
        return "survived"

    assert rt.run(main) == "survived"
    with pytest.raises(KeyError):
        rt.run(bad)


def test_cancel_a_queued_task_before_it_starts():
    ran = []

    def main():
        h = rt.spawn(ran.append, 1)
        assert h.cancel() and h.cancelled() and h.done()
        assert not h.cancel()  # already over
        with pytest.raises(cf.CancelledError):
            h.join()

    rt.run(main)
    assert ran == []


def test_cancel_a_parked_task_wakes_it_with_cancelled():
    trace = []

    def sleeper():
        try:
            rt.sleep(10)
        except Cancelled:
            trace.append("cleanup ran")
            raise

    def main():
        h = rt.spawn(sleeper)
        rt.yield_()  # it starts and parks
        assert h._ctx.state is ContextState.BLOCKED
        t0 = time.monotonic()
        assert h.cancel()
        with pytest.raises(cf.CancelledError):
            h.join()
        assert h.cancelled() and time.monotonic() - t0 < 1
        return h

    h = rt.run(main)
    assert trace == ["cleanup ran"]
    assert h._ctx.state is ContextState.REUSED


def test_cancel_a_running_task_at_its_next_switch():
    trace = []

    def spinner():
        for i in range(100):
            trace.append(i)
            rt.yield_()

    def main():
        h = rt.spawn(spinner)
        rt.yield_()
        rt.yield_()
        h.cancel()  # it is runnable (it yielded), so it takes it when it resumes
        with pytest.raises(cf.CancelledError):
            h.join()

    rt.run(main)
    assert trace == [0, 1]


def test_a_task_that_cancels_itself_ends_at_its_next_switch():
    def selfish():
        rt.current_task().cancel()
        rt.yield_()
        raise AssertionError("not reached")

    def main():
        h = rt.spawn(selfish)
        with pytest.raises(cf.CancelledError):
            h.join()
        return h.cancelled()

    assert rt.run(main)


def test_subtasks_spawn_and_join_recursively():
    def fib(n):
        if n < 2:
            return n
        a, b = rt.spawn(fib, n - 1), rt.spawn(fib, n - 2)
        return a.join() + b.join()

    assert rt.run(fib, 15) == 610


def test_async_def_tasks_sleep_yield_and_await_handles():
    trace = []

    async def child(x):
        await rt.sleep_async(0.01)
        trace.append(f"child {x}")
        return x * 2

    def sync_child():
        return "sync"

    async def main():
        h = rt.spawn(child, 21)
        s = rt.spawn(sync_child)
        await rt.yield_async()
        trace.append("main before await")
        r = await h
        return r, await s

    assert rt.run(main) == (42, "sync")
    assert trace == ["main before await", "child 21"]


def test_async_task_cancelled_while_awaiting():
    trace = []

    async def sleeper():
        try:
            await rt.sleep_async(10)
        except Cancelled:
            trace.append("async cleanup")
            raise

    def main():
        h = rt.spawn(sleeper)
        rt.yield_()
        h.cancel()
        with pytest.raises(cf.CancelledError):
            h.join()
        return h.cancelled()

    assert rt.run(main)
    assert trace == ["async cleanup"]


def test_awaiting_something_foreign_is_a_type_error_in_the_task():
    import asyncio

    async def bad():
        await asyncio.sleep(0)

    with pytest.raises(TypeError, match="runtime awaitables"):
        rt.run(bad)


def test_critical_defers_a_preemption_to_the_sections_end():
    trace = []

    def other():
        trace.append("other")

    def main():
        rt.spawn(other)
        with rt.critical():
            with rt.critical():
                assert rt.current_task()._critical == 2
                assert rt.request_preempt() is False
                trace.append("inner end")
            trace.append("outer still holds")
            assert rt.current_task()._preempt_requested
        trace.append("after section")
        assert rt.current_task()._critical == 0

    rt.run(main)
    assert trace == ["inner end", "outer still holds", "other", "after section"]


def test_request_preempt_outside_critical_yields_at_once():
    trace = []

    def main():
        rt.spawn(trace.append, "other")
        assert rt.request_preempt() is True
        trace.append("main again")

    rt.run(main)
    assert trace == ["other", "main again"]


def test_instrumentation_hooks_are_called_in_order():
    events = []

    class Recorder:
        def task_spawned(self, t):
            events.append(("spawned", name(t)))

        def before_task_step(self, t):
            events.append(("before", name(t)))

        def after_task_step(self, t):
            events.append(("after", name(t)))

        def task_exited(self, t):
            events.append(("exited", name(t)))

    def name(t):
        return t.fn.__name__ if t.fn else "?"

    def child():
        rt.yield_()

    def main():
        rt.spawn(child).join()

    rt.run(main, instruments=[Recorder()])
    assert events == [
        ("spawned", "main"),
        ("before", "main"),
        ("spawned", "child"),
        ("after", "main"),  # main parks in join
        ("before", "child"),
        ("after", "child"),  # child yields
        ("before", "child"),
        ("exited", "child"),
        ("after", "child"),
        ("before", "main"),
        ("exited", "main"),
        ("after", "main"),
    ]


def test_many_tasks_reuse_a_few_contexts():
    sched = Scheduler(pool_min=2)

    def main():
        for _ in range(100_000):
            rt.spawn(int)
        rt.yield_()
        return sched.pool.created

    created = sched.run(main)
    stats = sched.pool.stats()
    assert created == stats["created"] <= 3
    assert stats["reused"] >= 100_000 - 3


def test_task_local_storage_is_per_task():
    def child(i):
        assert rt.local() == {}
        rt.local()["i"] = i
        rt.yield_()
        return rt.local()["i"]

    def main():
        hs = [rt.spawn(child, i) for i in range(50)]
        return [h.join() for h in hs]

    assert rt.run(main) == list(range(50))


def test_tasks_wait_for_a_context_when_the_pool_is_full():
    def child(i):
        rt.sleep(0.001)
        return i

    def main():
        hs = [rt.spawn(child, i) for i in range(20)]
        return [h.join() for h in hs]

    sched = Scheduler(pool_max=4)
    assert sched.run(main) == list(range(20))
    assert sched.pool.created == 4


def test_a_task_cannot_wait_for_itself():
    with pytest.raises(RuntimeError, match="cannot wait for itself"):
        rt.run(lambda: rt.current_task().join())


def test_parked_tasks_with_nothing_to_wake_them_are_a_deadlock():
    def main():
        a = rt.spawn(lambda: b.join())
        b = rt.spawn(lambda: a.join())
        a.join()

    with pytest.raises(Deadlock, match="3 tasks are parked"):
        rt.run(main)
    gc.collect()  # the stuck tasks' greenlets end quietly, running nothing of the run
    assert rt.run(lambda: "next run") == "next run"


def test_keyboard_interrupt_in_a_task_stops_the_run():
    def main():
        rt.spawn(rt.sleep, 5)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rt.run(main)


def test_handles_are_futures_for_other_threads():
    box = {}
    started = threading.Event()

    def main():
        box["handles"] = [rt.spawn(rt.sleep, 0.05), rt.spawn(lambda: 7)]
        started.set()
        for h in box["handles"]:
            h.join()

    th = threading.Thread(target=rt.run, args=(main,))
    th.start()
    assert started.wait(5)
    handles = box["handles"]
    assert all(isinstance(h, cf.Future) for h in handles)
    done, not_done = cf.wait(handles, timeout=5)
    th.join(5)
    assert done == set(handles) and not not_done
    assert handles[1].result(timeout=1) == 7
    seen = []
    handles[1].add_done_callback(seen.append)
    assert seen == [handles[1]]


def test_wait_future_parks_on_a_thread_pool_future():
    with cf.ThreadPoolExecutor(1) as pool:

        def main():
            ticks = []
            rt.spawn(lambda: [ticks.append(1) or rt.sleep(0.001) for _ in range(5)])
            r = rt.wait_future(pool.submit(lambda: time.sleep(0.05) or "from thread"))
            return r, len(ticks)

        assert rt.run(main) == ("from thread", 5)


def test_runtime_calls_outside_a_task_are_refused():
    with pytest.raises(RuntimeError, match="no runtime scheduler"):
        rt.spawn(int)
    assert rt.current_task() is None
    for bad in ({"priority": 7}, {"priority": 1.0}, {"deadline": "soon"}, {"deadline": math.nan}):
        with pytest.raises(ValueError, match="priority class|deadline must be"):
            rt.run(lambda bad=bad: rt.spawn(int, **bad))
    assert isinstance(rt.run(lambda: rt.current_task()), TaskHandle)


def test_a_crash_in_the_last_task_still_stops_the_run():
    def child():
        raise SystemExit(3)

    def main():
        rt.spawn(child)
        return "main done first"

    with pytest.raises(SystemExit):
        rt.run(main)


def test_wait_future_times_out_and_a_late_completion_is_harmless():
    never_in_time = cf.Future()

    def main():
        with pytest.raises(TimeoutError):
            rt.wait_future(never_in_time, timeout=0.01)
        never_in_time.set_result("late")  # its wake-up is stale: the task moved on
        rt.sleep(0.01)
        return rt.wait_future(never_in_time)

    assert rt.run(main) == "late"


def test_as_completed_from_another_thread_sees_every_end():
    # Exercises the lazily made Condition against completions racing with the waiter.
    box, ready = {}, threading.Event()

    def main():
        hs = [rt.spawn(rt.sleep, (i % 7) / 1000) for i in range(500)]
        box["handles"] = hs
        ready.set()
        for h in hs:
            h.join()

    th = threading.Thread(target=rt.run, args=(main,))
    th.start()
    assert ready.wait(5)
    finished = list(cf.as_completed(box["handles"], timeout=10))
    th.join(5)
    assert len(finished) == 500 and all(h.result() is None for h in finished)
