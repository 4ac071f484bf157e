"""The pure parts of xhagent.bpf.runqlat: the map's log2 microsecond slots as a
Prometheus histogram, cgroup ids, and the error when the kernel has no BTF."""

import errno
import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xhagent.bpf import BpfError, runqlat
from xhagent.bpf.runqlat import RUNQ_SLOTS, UPPER_BOUNDS, Histogram, cgroup_id


def test_slots_become_cumulative_le_buckets_in_seconds():
    slots = [0] * RUNQ_SLOTS
    slots[0], slots[3], slots[10], slots[-1] = 4, 2, 1, 3
    h = Histogram.from_slots(slots, sum_ns=12_500_000_000)
    assert len(h.buckets) == RUNQ_SLOTS  # 23 finite bounds and +Inf
    assert h.buckets[0] == (2e-06, 4)  # slot 0: under 2 us
    assert h.buckets[2] == (8e-06, 4)
    assert h.buckets[3] == (1.6e-05, 6)  # slot 3: [8, 16) us
    assert h.buckets[10] == (0.002048, 7)
    assert h.buckets[-2] == (8.388608, 7)  # 2^23 us; the last slot is past it
    assert h.buckets[-1] == (math.inf, 10)
    assert (h.count, h.sum) == (10, 12.5)


def test_an_empty_histogram_is_all_zero():
    h = Histogram.from_slots([0] * RUNQ_SLOTS, 0)
    assert [n for _, n in h.buckets] == [0] * RUNQ_SLOTS
    assert (h.count, h.sum) == (0, 0.0)


def test_a_map_value_of_another_size_is_refused():
    with pytest.raises(ValueError, match=f"expected {RUNQ_SLOTS} slots, got 32"):
        Histogram.from_slots([0] * 32, 0)


def _slot(wait_ns: int) -> int:
    """The slot ebpf/runqlat.bpf.c picks: floor(log2(us)), 0 for 0 us, capped."""
    us = wait_ns // 1000
    return min(max(us.bit_length() - 1, 0), RUNQ_SLOTS - 1)


@given(st.integers(min_value=0, max_value=60 * 10**9))
def test_a_wait_lands_in_the_first_bucket_whose_bound_it_does_not_exceed(wait_ns):
    slots = [0] * RUNQ_SLOTS
    slots[_slot(wait_ns)] = 1
    h = Histogram.from_slots(slots, wait_ns)
    first = next(le for le, n in h.buckets if n)
    below = [le for le in (0.0, *UPPER_BOUNDS) if le < first]
    assert wait_ns / 1e9 <= first
    assert wait_ns / 1e9 >= below[-1]


def test_cgroup_ids_are_directory_inodes(tmp_path):
    assert cgroup_id(12345) == 12345
    with pytest.raises(ValueError, match="positive"):
        cgroup_id(0)
    with pytest.raises(ValueError, match="not a cgroup v2 directory"):
        cgroup_id(tmp_path)
    (tmp_path / "cgroup.controllers").write_text("")
    assert cgroup_id(tmp_path) == os.stat(tmp_path).st_ino


def test_without_kernel_btf_the_error_names_it(monkeypatch, tmp_path):
    monkeypatch.setattr(runqlat, "BTF", tmp_path / "vmlinux")
    with pytest.raises(BpfError) as exc:
        runqlat.RunqLatency()
    assert exc.value.errno == errno.ENOENT
    assert str(exc.value) == (
        f"run-queue latency needs the kernel's BTF, and {tmp_path / 'vmlinux'} is missing "
        "(a kernel built without CONFIG_DEBUG_INFO_BTF)"
    )
