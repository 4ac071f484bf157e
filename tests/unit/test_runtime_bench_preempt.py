"""The preemption bench's arithmetic: percentiles, and the hog's loss from its windows."""

import pytest

from xhagent.bench.pool_preempt import _pct, hog_loss


def test_percentile_is_the_nearest_rank():
    values = [float(x) for x in range(1, 101)]
    assert _pct(values, 50) == 50.0
    assert _pct(values, 99) == 99.0
    assert _pct(values, 100) == 100.0
    assert _pct([7.0], 99) == 7.0


def windows(rates_wall, rates_cpu, wall=0.1):
    """(iterations, wall s, CPU s) per window for the given rates."""
    out = []
    for rw, rc in zip(rates_wall, rates_cpu, strict=True):
        n = rw * wall
        out.append((n, wall, n / rc))
    return out


def test_loss_compares_odd_windows_with_their_even_neighbours():
    # Drifting speed (1 % a window) and 2 % lost in odd windows: the drift cancels out.
    speed = [1e6 * (1 + 0.01 * k) for k in range(21)]
    rates = [s * (0.98 if k % 2 else 1.0) for k, s in enumerate(speed)]
    loss, beside, alone = hog_loss(windows(rates, rates), 1)
    assert loss == pytest.approx(0.02, abs=1e-4)
    assert beside < alone


def test_loss_per_cpu_second_ignores_time_other_processes_took():
    # Odd windows lose 1 % to the latency task; every third window another process takes
    # half the wall time, which the per-wall-second rate sees and the CPU rate does not.
    cpu = [1e6 * (0.99 if k % 2 else 1.0) for k in range(21)]
    wall = [r * (0.5 if k % 3 == 0 else 1.0) for k, r in enumerate(cpu)]
    w = windows(wall, cpu)
    assert hog_loss(w, 2)[0] == pytest.approx(0.01, abs=1e-6)
    assert abs(hog_loss(w, 1)[0] - 0.01) > 0.05


def test_windows_the_hog_never_ran_in_are_left_out():
    rates = [1e6 * (0.97 if k % 2 else 1.0) for k in range(21)]
    w = windows(rates, rates)
    w[4] = w[9] = None
    assert hog_loss(w, 1)[0] == pytest.approx(0.03, abs=1e-6)
    with pytest.raises(RuntimeError, match="too few windows"):
        hog_loss([None] * 10, 1)


def test_a_node_without_bpf_gets_the_timers_figures_and_the_reason(monkeypatch):
    from xhagent.bench import pool_preempt

    windows = [(1000.0 * (0.99 if k % 2 else 1.0), 0.1, 0.1) for k in range(12)]

    def measure(mode, duration, cpu, slice_ms):
        if mode == "bpf":
            raise PermissionError(1, "load preempt.bpf.o: -EPERM (Operation not permitted)")
        loss, beside, alone = hog_loss(windows, 2)
        return {
            "source": mode,
            "lat": [0.005] * 98 + [0.012, 0.015],
            "loss": loss,
            "loss_cpu": loss,
            "beside": beside,
            "alone": alone,
            "cpu_share": 1.0,
        }

    monkeypatch.setattr(pool_preempt, "measure_source", measure)
    monkeypatch.setattr(pool_preempt, "asyncio_pair", lambda d: {"lat": [d], "hog_rate": 1.0})
    out = pool_preempt.cases(quick=True, cpu=0)
    assert "-EPERM" in out["cases"]["preempt_bpf"]["error"]
    assert out["ratios"]["preempt_p99_vs_slice_bpf"] is None
    assert out["ratios"]["preempt_p99_vs_slice_timer"] == 1.2  # p99 of 100: the 2nd largest
    assert out["ratios"]["preempt_hog_loss"] == pytest.approx(0.01, abs=1e-4)
    assert out["baseline"]["asyncio_wake_p99_us_beside_hog"] == 2e6
