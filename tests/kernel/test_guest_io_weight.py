"""io.weight where a device queue, not the emulator, is the bottleneck: `bench cgroup-io
--device nullb` makes a null_blk disk (1 ms timer completions, 16 in flight), writes a
fixed io.cost model whose budget sits below what that disk does, and has groups read it
at once. The split follows the weights: 500/100 within 15% of 5:1 (the first group's
share within 0.05 of 5/6), 500/100/10 and the nested pair in the order their weights
give; BFQ's split is reported; and the run leaves nothing behind."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from xhagent.cgroups.io_weight import io_cost_enabled

pytestmark = pytest.mark.kernel
NULLB = Path("/sys/kernel/config/nullb")


@pytest.fixture(scope="module")
def bench():
    if not NULLB.is_dir():
        pytest.fail(f"{NULLB} is missing: tools/vmtest loads null_blk and mounts configfs")
    before = sorted(p.name for p in Path("/sys/block").iterdir())
    proc = subprocess.run(
        [sys.executable, "-m", "xhagent.cli", "bench", "cgroup-io", "--device", "nullb"]
        + ["--seconds", "5", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), before


def runs(result):
    return {run["case"]: run for run in result["runs"]}


def test_two_groups_split_the_disk_by_their_weights(bench):
    """500/100 wants shares 0.833 / 0.167 (5:1): the first group's share is held within
    0.05 of 5/6 and the ratio within 15% of 5. With the vrate capped at 100% the budget
    stays below what either reader can issue: 4.60-4.96:1 in eight runs of the bench.
    (Uncapped: 4.24:1 and 3.93:1 in 2 of 13 runs; on the emulated NVMe disk, where io.cost
    does not throttle, 1.7:1.)"""
    result, _ = bench
    two = runs(result)["two"]
    assert result["enforcer"]["two"] == {result["majmin"]: "io.cost"}
    assert two["weight_share"] == [0.8333, 0.1667]
    assert two["share"][0] == pytest.approx(0.8333, abs=0.05), two
    assert 5 * 0.85 <= two["achieved_ratio_first_to_last"] <= 5 * 1.15, two
    # io.cost charged each group for what it read: the heavier one more
    assert two["cost_usage_us"][0] > two["cost_usage_us"][1] > 0


def test_three_groups_and_the_nested_pair_come_in_weight_order(bench):
    """The nested case: the parents split 200/100 (2/3 : 1/3), within 0.08, and inside the
    first parent the 300-weight child leads the 100 one. The children's own shares are not
    held: the 100 child got 0.18-0.20 (1/6 wanted) in two runs and 0.25 in a third, where
    io.cost gave it what its sibling left unused."""
    result, _ = bench
    three, nested = runs(result)["three"], runs(result)["nested"]
    assert three["IOPS"][0] > three["IOPS"][1] > three["IOPS"][2] > 0, three
    # p0-200/c0-300 (1/2) > p1-100 (1/3) > p0-200/c1-100 (1/6)
    got = dict(zip(nested["groups"], nested["IOPS"], strict=True))
    assert got["p0-200/c0-300"] > got["p1-100"] > got["p0-200/c1-100"] > 0, nested
    share = dict(zip(nested["groups"], nested["share"], strict=True))
    parent = share["p0-200/c0-300"] + share["p0-200/c1-100"]
    assert parent == pytest.approx(2 / 3, abs=0.08), nested


def test_the_bfq_case_runs_under_bfq_alone_and_reports_its_split(bench):
    """BFQ is measured, not held to the weights: on this disk under emulation it split
    about 1:1 (BFQ's own CPU, not the queue, limits it); the figure is the bench's."""
    result, _ = bench
    bfq = runs(result)["bfq"]
    assert result["enforcer"]["bfq"] == {result["majmin"]: "bfq"}
    assert bfq["scheduler"] == "bfq"
    assert all(iops > 0 for iops in bfq["IOPS"]), bfq
    assert bfq["achieved_ratio_first_to_last"] is not None


def test_the_run_leaves_no_disk_group_or_io_cost_behind(bench):
    result, before = bench
    assert sorted(p.name for p in Path("/sys/block").iterdir()) == before
    assert [p.name for p in NULLB.iterdir() if p.is_dir()] == []  # `features` is a file
    assert not any(p.name.startswith("xhagent-bench-") for p in Path("/sys/fs/cgroup").iterdir())
    qos = Path("/sys/fs/cgroup/io.cost.qos").read_text()
    assert result["majmin"] not in io_cost_enabled(qos)
