"""DWPS: the fragmentation metric as specified, threshold dynamics, victims by fit."""

import pytest

from xhagent.sched.dwps import (
    Allocation,
    Dwps,
    GpuMemory,
    Threshold,
    fragmentation,
    largest_block_fragmentation,
    rank_victims,
)

MiB = 1 << 20


def gpu(*allocs, total=100 * MiB):
    return GpuMemory(total, [Allocation(o, s * MiB, z * MiB, *rest) for o, s, z, *rest in allocs])


def test_f_as_specified_is_one_with_any_free_memory_and_zero_without():
    assert fragmentation(gpu(("a", 0, 100))) == 0.0  # no free block, total_free 0
    assert fragmentation(gpu(("a", 0, 50))) == pytest.approx(1.0)  # one hole
    dust = gpu(*[(f"a{i}", i * 10, 9) for i in range(10)])  # ten 1 MiB holes
    assert fragmentation(dust) == pytest.approx(1.0)
    assert largest_block_fragmentation(gpu(("a", 0, 50))) == 0.0
    assert largest_block_fragmentation(dust) == pytest.approx(0.9)
    assert largest_block_fragmentation(gpu(("a", 0, 100))) == 0.0


def test_overlapping_allocations_are_refused():
    with pytest.raises(ValueError, match="overlaps"):
        gpu(("a", 0, 10), ("b", 5, 10))


def test_threshold_drops_per_consecutive_failed_compaction_to_the_floor_and_resets():
    t = Threshold()
    seen = [t.value]
    for _ in range(7):
        t.compaction(succeeded=False)
        seen.append(t.value)
    assert seen == [0.65, 0.63, 0.61, 0.59, 0.57, 0.55, 0.55, 0.55]
    t.compaction(succeeded=True)
    assert t.value == 0.65


def test_victims_ranked_by_fit_then_affinity_pinned_never():
    # [a 0-10][hole][b 20-30][hole][c 40-50][hole][d 60-100, not preemptible]
    g = gpu(("a", 0, 10, 0.9), ("b", 20, 10, 0.2), ("c", 40, 10, 0.1), ("d", 60, 40, 0.0, False))
    ranked = rank_victims(g, 24 * MiB)
    names = [(a.owner, round(fit, 3)) for a, fit in ranked]
    # evicting c leaves 30..60 (30 MiB, fit .8), b 10..40 (30 MiB, fit .8 but more affinity),
    # a 0..20 (20 MiB: too small alone)
    assert names == [("c", 0.8), ("b", 0.8), ("a", 0.0)]
    g = gpu(("a", 0, 10, 0.9), ("b", 20, 10, 0.2), ("c", 40, 10, 1.0))  # affinity 1: pinned
    assert [a.owner for a, _ in rank_victims(g, 24 * MiB)] == ["b", "a"]
    assert "d" not in {a.owner for a, _ in ranked}


def test_decide_preempts_only_above_the_threshold_and_when_the_request_does_not_fit():
    g = gpu(("a", 0, 10, 0.3), ("b", 20, 70, 0.9))
    seed = Dwps(metric=fragmentation)
    assert seed.decide(g, 10 * MiB) == []  # fits in a hole already
    assert [a.owner for a in seed.decide(g, 15 * MiB)] == [
        "a",
        "b",
    ]  # F = 1 > 0.65; a leaves 20, b 90
    strict = Dwps()  # 1 - 10/20 = 0.5 <= 0.65
    assert strict.decide(g, 15 * MiB) == []
    for _ in range(5):
        strict.compaction(succeeded=False)  # threshold 0.55: still above 0.5
    assert strict.decide(g, 15 * MiB) == []
    dusty = gpu(
        ("a", 0, 10, 0.3), ("b", 13, 30), ("c", 46, 30), ("d", 79, 19)
    )  # holes 3,3,3,2 -> 1-3/11
    # evicting a leaves 13 MiB (fit .92), d 24 (.5), b and c 36 (.33; equal affinity, by name)
    assert [a.owner for a in strict.decide(dusty, 12 * MiB)] == ["a", "d", "b", "c"]


def test_compact_evicts_the_best_fit_among_the_movable_and_adapts_the_threshold():
    # holes of 10 at 10, 30 and 50 MiB: 30 free, largest 10 -> F = 2/3 over 0.65
    scattered = gpu(("a", 0, 10), ("b", 20, 10), ("c", 40, 10), ("d", 60, 40))
    d = Dwps()
    # leaving, a opens 20 (fit 1.0), b and c 30 (0.67), d 50 (0.4)
    done = d.compact(scattered, 20 * MiB, lambda owner: True)
    assert done.victim.owner == "a" and done.fragmentation == pytest.approx(2 / 3)
    assert done.threshold == 0.65 and d.threshold.value == 0.65
    assert d.compact(scattered, 20 * MiB, lambda owner: owner != "a").victim.owner == "b"
    assert d.compact(scattered, 20 * MiB, lambda owner: owner == "d").victim.owner == "d"
    done = d.compact(scattered, 20 * MiB, lambda owner: False)
    assert done.victim is None and d.threshold.value == 0.63  # a failed compaction
    assert d.compact(gpu(("a", 0, 10)), 20 * MiB, lambda owner: True) is None  # one hole: F 0
    assert d.threshold.value == 0.63  # nothing tried, nothing counted
