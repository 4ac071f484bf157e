"""The scheduler's C path (native/sched.c): a yield queues the task from what the pick
learnt of it (its class, its deadline), and hands over to the Python scheduler for timers,
other threads' wake-ups, a clock written in Python and instruments."""

import threading
import time

import pytest

from xhagent import _sched
from xhagent.runtime import api as rt
from xhagent.runtime.context import ContextState
from xhagent.runtime.scheduler import NORMAL, Scheduler
from xhagent.runtime.task import Cancelled, TaskHandle


def test_yielding_deadline_tasks_keep_edf_order_and_tie_behind_their_equals():
    trace = []

    def worker(name):
        for i in range(2):
            trace.append((name, i))
            rt.yield_()

    def main():
        now = time.monotonic()
        rt.spawn(worker, "late", deadline=now + 20)
        rt.spawn(worker, "early", deadline=now + 10)
        rt.spawn(worker, "tie", deadline=now + 10)
        rt.spawn(worker, "none")

    rt.run(main)
    # EDF within the class: "early" and "tie" (same deadline) take turns, then "late",
    # then the deadline-less one; a yield goes behind its equals, never before.
    assert trace == [
        ("early", 0),
        ("tie", 0),
        ("early", 1),
        ("tie", 1),
        ("late", 0),
        ("late", 1),
        ("none", 0),
        ("none", 1),
    ]


def test_a_due_timer_wakes_its_sleeper_while_others_keep_yielding():
    seen = []

    def sleeper():
        rt.sleep(0.01)
        seen.append("woke")

    def spinner():
        end = time.monotonic() + 5
        while not seen and time.monotonic() < end:
            rt.yield_()
        seen.append("spinner saw it")

    def main():
        rt.spawn(sleeper)
        rt.spawn(spinner)

    rt.run(main)
    assert seen == ["woke", "spinner saw it"]


def test_a_wake_up_from_another_thread_reaches_a_yielding_scheduler():
    def main():
        fut = __import__("concurrent.futures").futures.Future()
        threading.Timer(0.01, fut.set_result, (7,)).start()
        waiter = rt.spawn(rt.wait_future, fut)
        end = time.monotonic() + 5
        while not waiter.done() and time.monotonic() < end:
            rt.yield_()
        return waiter.result()

    assert rt.run(main) == 7


def test_a_clock_written_in_python_is_called_from_python_only():
    ticks = []

    def clock():
        ticks.append(1)
        return len(ticks) * 0.001

    def sleeper():
        rt.sleep(0.005)
        return "slept"

    def main():
        h = rt.spawn(sleeper)
        while not h.done():
            rt.yield_()
        return h.result()

    assert Scheduler(clock=clock).run(main) == "slept"


def test_cancel_requested_on_a_yielder_raises_at_its_yield():
    def spinner():
        while True:
            rt.yield_()

    def main():
        h = rt.spawn(spinner)
        rt.yield_()  # it starts (it holds a context) and yields back
        assert h.cancel()
        rt.yield_()
        return h.cancelled(), h._cancel_requested

    assert rt.run(main) == (True, True)


def test_the_current_task_set_from_python_is_queued_from_its_own_fields():
    def main():
        sched = rt._core._running
        me = sched.current
        sched.current = me  # forgets what the pick learnt: the yield reads the task
        rt.yield_()
        return me.priority

    assert rt.run(main) == NORMAL


def test_the_c_yield_outside_a_scheduler_is_refused():
    with pytest.raises(RuntimeError, match="no runtime scheduler"):
        _sched.yield_()
    with pytest.raises(TypeError):
        Scheduler()._ready(object())


def test_task_base_fields_default_and_a_task_has_no_dict_of_its_own():
    t = TaskHandle.__new__(TaskHandle)
    assert (t._g, t._cancel_requested, t._preempt_requested) == (None, False, False)
    with pytest.raises(Cancelled):
        raise Cancelled()


def test_a_fresh_task_binds_a_reused_context_in_c_and_counts_it():
    def main():
        sched = rt._core._running
        rt.spawn(int).join()  # its context is released, Reused, at the free list's end
        before = sched.pool.reused
        h = rt.spawn(rt.current_task)
        assert h.join() is h and h._ctx.state is ContextState.REUSED
        return sched.pool.reused - before

    assert rt.run(main) == 1
