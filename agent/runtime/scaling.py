"""The context pool's autoscaling, applied to a running scheduler: runtime.autoscale
decides, this module observes and enacts.

A scheduler made with `scale=ScaleConfig(...)` binds at most `pool.cap` contexts at once
(ContextPool.resize sets it); a task picked for its first step while `cap` are bound
waits in the context wait list, unstarted, until a context is released or the cap grows.
The cap starts at the configured minimum (at least one) and moves between min and max:

  * every `interval_s` an Observation goes to `autoscale.decide`: the mean time tasks
    waited for a context since the last one (those still waiting count their wait so
    far), the idle share of the cap (1 - bound / cap, at that instant) and the cap; a new
    target resizes the pool (growth makes contexts at once, a shrink ends free ones) and
    waiting tasks get the contexts that growth made;
  * a safety valve, outside the window and cooldown: tasks wait for a context while no
    task is runnable (every bound task parked, or the caller only). Left alone the CPU
    would idle, or tasks waiting on unstarted ones would never be woken, so the cap grows
    one step (`autoscale.grown`) at once, and again at the next look if that was not
    enough. `valves` counts these.

Observations are taken where the scheduler already is in Python: after a released
context was handed over (only while tasks wait), before an idle sleep, and wherever the
caller calls `Scheduler.scale_tick()` (a pool worker's feeder, once per loop). Without
`scale` none of this runs and the cap is the pool's max.
"""

from __future__ import annotations

from collections import deque

from .autoscale import Observation, ScaleConfig, ScaleState, decide, grown


class ContextScaler:
    def __init__(self, cfg: ScaleConfig, clock):
        self.cfg, self.clock = cfg, clock
        self.state = ScaleState()
        self.next_t = clock() + cfg.interval_s
        self.since: deque[float] = deque()  # when each task in the wait list began waiting
        self.wait_sum, self.wait_n = 0.0, 0  # waits ended since the last observation
        self.changes = self.valves = 0
        self.last: Observation | None = None

    def waiting(self) -> None:
        """A task joined the back of the context wait list."""
        self.since.append(self.clock())

    def left(self) -> None:
        """The task at the front of the wait list left it (bound, or cancelled)."""
        self.wait_sum += self.clock() - self.since.popleft()
        self.wait_n += 1

    def tick(self, sched) -> None:
        pool = sched.pool
        if sched._ctx_wait and pool.cap < pool.max and sched.runnable_class() is None:
            self.valves += 1
            self._apply(sched, grown(self.cfg, pool.cap))
        now = self.clock()
        if now < self.next_t:
            return
        self.next_t = now + self.cfg.interval_s
        n = self.wait_n + len(self.since)
        mean = (self.wait_sum + sum(now - t for t in self.since)) / n if n else 0.0
        self.wait_sum, self.wait_n = 0.0, 0
        bound = pool.live - len(pool.free)
        obs = self.last = Observation(now, mean, max(0.0, 1 - bound / pool.cap), pool.cap)
        target, self.state = decide(self.cfg, obs, self.state)
        target = max(1, target)  # the pool binds at least one context (ContextPool.resize)
        if target != pool.cap:
            self.changes += 1
            self._apply(sched, target)

    def _apply(self, sched, target: int) -> None:
        sched.pool.resize(target)
        sched._bind_waiting()

    def stats(self) -> dict:
        last = self.last
        return {
            "changes": self.changes,
            "valves": self.valves,
            "last_mean_wait_s": None if last is None else round(last.mean_wait_s, 6),
            "last_idle_ratio": None if last is None else round(last.idle_ratio, 4),
            "waiting": len(self.since),
        }
