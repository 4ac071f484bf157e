"""The pool's scaling policy, as pure decisions: observations in, a target size out.

From the seed (chapter 3.2): grow by 20% (up to the hard maximum) when the mean queue wait
exceeds 200 ms; shrink step by step towards the minimum when more than 70% of the pool is
idle. What keeps it from flapping:

  * a window: a condition must hold in every observation for `window_s` before it acts,
    and one observation without it starts the count again;
  * a cooldown: after a change, `cooldown_s` pass before the next one, and both counts
    start again (observations of the old size say little about the new one);
  * a dead band: the two conditions cannot hold at once (a pool with queued waits above
    the threshold is not shrunk however idle it looks, so the two never alternate on the
    same observation).

A size outside [min, max] (a changed configuration) is brought back at once: the bounds
are limits, not advice.

No clock, no I/O: `decide` takes the state it returned last time, so a series can be
replayed in tests and the worker only has to feed it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ScaleConfig:
    min: int
    max: int
    scale_up_wait_s: float = 0.2  # mean queue wait above which the pool grows
    scale_up_factor: float = 1.2  # growth per step (rounded up, at least one context)
    shrink_idle_ratio: float = 0.7  # idle share of the pool above which it shrinks
    shrink_factor: float = 0.8  # shrink per step (rounded down, at least one context)
    window_s: float = 5.0  # how long a condition must hold before it acts
    cooldown_s: float = 10.0  # quiet time after any change
    interval_s: float = 1.0  # time between observations (runtime.scaling takes them)

    def __post_init__(self):
        problems = []
        for name in ("min", "max"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                problems.append(f"{name} must be a whole number >= 0, not {v!r}")
        if not problems:
            if self.max < 1:
                problems.append(f"max must be at least 1, not {self.max}")
            if self.min > self.max:
                problems.append(f"min {self.min} is above max {self.max}")
        for name, ok, rule in (
            ("scale_up_wait_s", lambda v: v > 0, "> 0 seconds"),
            ("scale_up_factor", lambda v: v > 1, "> 1"),
            ("shrink_idle_ratio", lambda v: 0 < v < 1, "between 0 and 1 (exclusive)"),
            ("shrink_factor", lambda v: 0 < v < 1, "between 0 and 1 (exclusive)"),
            ("window_s", lambda v: v >= 0, ">= 0 seconds"),
            ("cooldown_s", lambda v: v >= 0, ">= 0 seconds"),
            ("interval_s", lambda v: v > 0, "> 0 seconds"),
        ):
            v = getattr(self, name)
            if not _finite(v) or not ok(v):
                problems.append(f"{name} must be a finite number {rule}, not {v!r}")
        if problems:
            raise ValueError("autoscale configuration: " + "; ".join(problems))


@dataclass(frozen=True)
class Observation:
    t: float  # seconds, any monotonic origin
    mean_wait_s: float  # mean time tasks waited in the run queue since the last observation
    idle_ratio: float  # share of the pool's contexts idle over that period, 0..1
    size: int  # the pool's size now

    def __post_init__(self):
        if not (_finite(self.t) and _finite(self.mean_wait_s) and self.mean_wait_s >= 0):
            raise ValueError(f"observation needs a finite time and wait >= 0: {self}")
        if not (_finite(self.idle_ratio) and 0 <= self.idle_ratio <= 1):
            raise ValueError(f"idle_ratio must be within 0..1: {self.idle_ratio!r}")
        if not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"size must be a whole number >= 0: {self.size!r}")


@dataclass(frozen=True)
class ScaleState:
    """What `decide` remembers between observations."""

    up_since: float | None = None  # first observation of the current high-wait streak
    down_since: float | None = None  # first observation of the current idle streak
    last_change: float | None = None
    last_t: float | None = field(default=None)


def grown(cfg: ScaleConfig, size: int) -> int:
    # round(..., 9) first: 5 * 1.2 is 6.000000000000001 in floating point, not 7 contexts.
    return min(cfg.max, max(size + 1, math.ceil(round(size * cfg.scale_up_factor, 9))))


def shrunk(cfg: ScaleConfig, size: int) -> int:
    return max(cfg.min, min(size - 1, math.floor(round(size * cfg.shrink_factor, 9))))


def decide(
    cfg: ScaleConfig, obs: Observation, state: ScaleState = ScaleState()
) -> tuple[int, ScaleState]:
    """The pool's target size after `obs`, and the state to pass with the next one."""
    if state.last_t is not None and obs.t < state.last_t:
        raise ValueError(f"observations go back in time: {obs.t} after {state.last_t}")
    size, t = obs.size, obs.t
    if size < cfg.min or size > cfg.max:
        return min(cfg.max, max(cfg.min, size)), ScaleState(last_change=t, last_t=t)
    busy = obs.mean_wait_s > cfg.scale_up_wait_s
    idle = not busy and obs.idle_ratio > cfg.shrink_idle_ratio
    state = replace(
        state,
        up_since=(state.up_since if state.up_since is not None else t) if busy else None,
        down_since=(state.down_since if state.down_since is not None else t) if idle else None,
        last_t=t,
    )
    if state.last_change is not None and t - state.last_change < cfg.cooldown_s:
        return size, replace(state, up_since=None, down_since=None)
    if busy and t - state.up_since >= cfg.window_s and size < cfg.max:
        return grown(cfg, size), ScaleState(last_change=t, last_t=t)
    if idle and t - state.down_since >= cfg.window_s and size > cfg.min:
        return shrunk(cfg, size), ScaleState(last_change=t, last_t=t)
    return size, state


def follow(cfg: ScaleConfig, size: int, samples: Iterable[tuple[float, float, float]]):
    """Replay (t, mean_wait_s, idle_ratio) samples against a pool that takes every target
    at once; the size after each sample."""
    state, sizes = ScaleState(), []
    for t, wait, idle in samples:
        size, state = decide(cfg, Observation(t, wait, idle, size), state)
        sizes.append(size)
    return sizes


def _finite(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
