"""The pool's scaling decisions on synthetic series of queue wait and idle ratio."""

from itertools import pairwise

import pytest

from xhagent.runtime.autoscale import (
    Observation,
    ScaleConfig,
    ScaleState,
    decide,
    follow,
    grown,
    shrunk,
)

CFG = ScaleConfig(min=4, max=40, window_s=3.0, cooldown_s=5.0)


def series(t0, t1, wait, idle, step=1.0):
    n = int(round((t1 - t0) / step))
    return [(t0 + i * step, wait, idle) for i in range(n)]


def test_grows_by_a_fifth_rounded_up_after_the_window():
    sizes = follow(CFG, 10, series(0, 4, wait=0.5, idle=0.0))
    # t=0 starts the streak; at t=3 it has held for the 3 s window: 10 * 1.2 = 12.
    assert sizes == [10, 10, 10, 12]


def test_growth_rounds_up_and_stops_at_max():
    assert grown(CFG, 5) == 6  # 5 * 1.2 = 6 exactly, despite floating point
    assert grown(CFG, 11) == 14  # 13.2 rounded up
    assert grown(CFG, 1) == 2  # at least one more
    assert grown(CFG, 38) == 40  # capped
    sizes = follow(CFG, 30, series(0, 60, wait=1.0, idle=0.0))
    assert sizes[-1] == 40 and max(sizes) == 40
    assert sorted(set(sizes)) == [30, 36, 40]


def test_a_short_spike_does_not_grow_the_pool():
    samples = series(0, 2, 0.5, 0.0) + series(2, 3, 0.1, 0.2) + series(3, 5, 0.5, 0.0)
    assert follow(CFG, 10, samples) == [10] * 5


def test_wait_at_the_threshold_is_not_above_it():
    assert follow(CFG, 10, series(0, 10, wait=0.2, idle=0.0)) == [10] * 10


def test_shrinks_when_idle_for_the_window_and_never_below_min():
    sizes = follow(CFG, 20, series(0, 100, wait=0.0, idle=0.9))
    assert sizes[:4] == [20, 20, 20, 16]  # 20 * 0.8
    assert min(sizes) == 4 and sizes[-1] == 4
    steps = [b for a, b in pairwise(sizes) if a != b]
    assert steps == [16, 12, 9, 7, 5, 4]  # step by step, each at least one smaller
    assert shrunk(CFG, 5) == 4 and shrunk(CFG, 4) == 4


def test_idle_at_or_below_the_ratio_keeps_the_size():
    assert follow(CFG, 20, series(0, 30, wait=0.0, idle=0.7)) == [20] * 30


def test_an_idle_pool_with_long_waits_is_not_shrunk():
    # High idle share and high wait at once (bursty arrivals): the wait wins.
    sizes = follow(CFG, 10, series(0, 4, wait=0.5, idle=0.95))
    assert sizes[-1] == 12


def test_cooldown_spaces_changes():
    sizes = follow(CFG, 10, series(0, 20, wait=1.0, idle=0.0))
    changes = [i for i in range(1, len(sizes)) if sizes[i] != sizes[i - 1]]
    # First at t=3; then 5 s of cooldown (t=3..7) and a fresh 3 s window from t=8: t=11.
    assert changes[:2] == [3, 11]


def test_an_oscillating_series_does_not_flap():
    busy, idle = (1.0, 0.0), (0.0, 0.95)
    samples = [(float(t), *(busy if t % 4 < 2 else idle)) for t in range(200)]
    assert follow(CFG, 10, samples) == [10] * 200
    # Slower swings, each longer than the window, change the size at most once per
    # cooldown plus window, so never on consecutive observations.
    samples = [(float(t), *(busy if (t // 10) % 2 == 0 else idle)) for t in range(200)]
    sizes = follow(CFG, 10, samples)
    changes = [i for i in range(1, len(sizes)) if sizes[i] != sizes[i - 1]]
    assert all(b - a >= CFG.cooldown_s + CFG.window_s for a, b in pairwise(changes))
    assert 4 <= min(sizes) and max(sizes) <= 40


def test_sizes_outside_the_bounds_are_brought_back_at_once():
    assert decide(CFG, Observation(0, 0.0, 0.0, 2))[0] == 4
    assert decide(CFG, Observation(0, 0.0, 0.0, 99))[0] == 40


def test_every_threshold_is_configurable():
    cfg = ScaleConfig(
        min=1,
        max=100,
        scale_up_wait_s=0.05,
        scale_up_factor=2.0,
        shrink_idle_ratio=0.5,
        shrink_factor=0.5,
        window_s=0.0,
        cooldown_s=0.0,
    )
    assert follow(cfg, 10, [(0, 0.06, 0.0), (1, 0.06, 0.0)]) == [20, 40]
    assert follow(cfg, 40, [(0, 0.0, 0.6), (1, 0.0, 0.6)]) == [20, 10]


def test_time_going_backwards_is_refused():
    _, state = decide(CFG, Observation(10, 0.0, 0.0, 10))
    with pytest.raises(ValueError, match="back in time"):
        decide(CFG, Observation(9, 0.0, 0.0, 10), state)


def test_the_default_state_is_empty():
    assert ScaleState() == ScaleState(None, None, None, None)


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"min": -1}, "min must be a whole number"),
        ({"max": 0}, "max must be at least 1"),
        ({"min": 5, "max": 3}, "min 5 is above max 3"),
        ({"min": 1.5}, "min must be a whole number"),
        ({"scale_up_wait_s": 0}, "scale_up_wait_s must be a finite number > 0"),
        ({"scale_up_factor": 1.0}, "scale_up_factor must be a finite number > 1"),
        ({"shrink_idle_ratio": 1.0}, "shrink_idle_ratio must be a finite number between"),
        ({"shrink_factor": 0}, "shrink_factor must be"),
        ({"window_s": -1}, "window_s must be"),
        ({"cooldown_s": float("nan")}, "cooldown_s must be"),
        ({"scale_up_factor": "fast"}, "scale_up_factor must be"),
    ],
)
def test_bad_configurations_are_refused_with_a_clear_message(kw, msg):
    args = {"min": 1, "max": 10, **kw}
    with pytest.raises(ValueError, match=msg):
        ScaleConfig(**args)


@pytest.mark.parametrize(
    "args", [(0, -0.1, 0.5, 1), (0, 0.1, 1.5, 1), (0, 0.1, 0.5, -1), (float("inf"), 0, 0, 1)]
)
def test_bad_observations_are_refused(args):
    with pytest.raises(ValueError):
        Observation(*args)
