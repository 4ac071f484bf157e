"""The context pool's autoscaling in a running scheduler (runtime.scaling): the cap bounds
the tasks started at once, long waits grow it, an idle pool shrinks back step by step,
and tasks that wait on unstarted ones are not left deadlocked by the cap."""

from xhagent.runtime import api as rt
from xhagent.runtime.autoscale import ScaleConfig, grown
from xhagent.runtime.scheduler import Scheduler


class Clock:
    """A clock the tasks move: what a task 'runs' is an advance of it."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def bound(sched) -> int:
    return sched.pool.live - len(sched.pool.free)


def test_the_cap_bounds_the_tasks_started_at_once():
    cfg = ScaleConfig(min=3, max=50, interval_s=3600)  # no observation in this run
    seen = []

    def task(i):
        for _ in range(5):
            seen.append(bound(rt._core._running))
            rt.yield_()
        return i

    def main():
        tasks = [rt.spawn(task, i) for i in range(20)]
        return [t.join() for t in tasks], rt._core._running

    got, sched = Scheduler(scale=cfg).run(main)
    assert got == list(range(20))
    assert max(seen) == 3  # main and two tasks: the cap, never more
    assert sched.pool.cap == 3 and sched._scaler.valves == 0
    assert sched.pool.created == 3


def test_tasks_waiting_on_unstarted_ones_open_the_cap_instead_of_deadlocking():
    cfg = ScaleConfig(min=2, max=50, interval_s=3600)
    n = 8
    tasks = []

    def link(i):  # each waits for the next one, spawned after it
        return tasks[i + 1].join() + 1 if i + 1 < n else 0

    def main():
        tasks.extend(rt.spawn(link, i) for i in range(n))
        return tasks[0].join(), rt._core._running

    got, sched = Scheduler(scale=cfg).run(main)
    assert got == n - 1
    path = [2]  # a step each time every started task was parked: until all 9 had one
    while path[-1] < n + 1:
        path.append(grown(cfg, path[-1]))
    assert path == [2, 3, 4, 5, 6, 8, 10]
    assert sched._scaler.valves == len(path) - 1 and sched.pool.cap == path[-1]


def test_long_waits_grow_the_cap_and_idleness_shrinks_it_back():
    clock = Clock()
    cfg = ScaleConfig(
        min=2,
        max=40,
        scale_up_wait_s=0.2,
        window_s=0.5,
        cooldown_s=0.5,
        interval_s=0.1,
        shrink_idle_ratio=0.7,
    )
    caps, seen = [], []

    def work():  # 50 ms of "CPU" in five slices
        for _ in range(5):
            clock.t += 0.01
            seen.append(bound(rt._core._running))
            rt.yield_()

    def main():
        sched = rt._core._running
        tasks = [rt.spawn(work) for _ in range(300)]
        for t in tasks:
            t.join()
        caps.append(sched.pool.cap)
        for _ in range(100):  # a quiet pool: only main bound
            clock.t += 0.1
            sched.scale_tick()
            caps.append(sched.pool.cap)
        return sched

    sched = Scheduler(scale=cfg, clock=clock).run(main)
    assert caps[0] > 2 and max(seen) > 2  # the waits grew it, and more tasks ran at once
    assert max(seen) <= max(caps)
    # The quiet ticks: the first may still grow it (its interval saw the burst's last
    # waits); from the peak on it only shrinks, one step per cooldown, while more than
    # 70% of the cap is idle: with main alone bound, while 1 - 1/cap > 0.7, so down to 3
    # (2 of 3 idle), above min 2.
    peak = caps.index(max(caps))
    after = caps[peak:]
    assert all(b <= a for a, b in zip(after, after[1:], strict=False))
    assert after[-1] == 3 and len(set(after)) >= 5  # e.g. 27, 21, 16, 12, 9, 7, 5, 4, 3
    assert sched._scaler.changes >= len(set(after)) - 1
    assert sched.pool.live == len(sched.pool.free) == 3  # ended, not only capped (run over)


def test_without_scale_the_cap_is_the_max_and_the_c_bind_is_kept():
    def main():
        return rt._core._running

    sched = Scheduler(pool_max=7).run(main)
    assert sched.pool.cap == 7 and sched._scaler is None
    assert sched._free is sched.pool.free
