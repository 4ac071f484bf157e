"""`xhagent bench cgroup-io`: bad option values are refused before anything is touched, and a
stop puts io.cost and the root's controllers back."""

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from xhagent.bench import cgroup_io as cgroup_bench
from xhagent.cli import main


@pytest.mark.parametrize(
    "args",
    [
        ["--seconds", "nan"],
        ["--seconds", "inf"],
        ["--seconds", "0"],
        ["--depth", "0"],
        ["--depth", "100000"],
        ["--block", "0"],
        ["--block", "1000"],
        ["--block", str(1 << 40)],
    ],
)
def test_bad_option_values_exit_2(args):
    res = CliRunner().invoke(main, ["bench", "cgroup-io", *args])
    assert res.exit_code == 2, res.output
    assert "Invalid value" in res.output


def _a_block_device():
    for entry in sorted(Path("/sys/block").iterdir()):
        if (Path("/dev") / entry.name).is_block_device():
            return entry.name
    pytest.skip("no block device node under /dev")


def test_a_stop_puts_io_cost_and_controllers_back(tmp_path, monkeypatch):
    from xhagent.cgroups.subtree import Subtree

    if os.geteuid() != 0:
        pytest.skip("the bench refuses to start without root")
    device = _a_block_device()
    majmin = (Path("/sys/block") / device / "dev").read_text().strip()
    (tmp_path / "cgroup.controllers").write_text("io\n")
    (tmp_path / "cgroup.subtree_control").write_text("\n")
    (tmp_path / "io.cost.qos").write_text("")
    monkeypatch.setattr(cgroup_bench, "locate", lambda rel: Subtree(tmp_path, rel))

    def stopped(*args, **kw):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the stop did not end the run")

    monkeypatch.setattr(cgroup_bench, "_one_run", stopped)
    res = CliRunner().invoke(main, ["bench", "cgroup-io", "--device", device])
    assert res.exit_code == 128 + signal.SIGTERM, res.output
    assert "put back" in res.output
    assert (tmp_path / "io.cost.qos").read_text() == f"{majmin} enable=0"
    assert (tmp_path / "cgroup.subtree_control").read_text().startswith("-io")


def test_each_case_wants_the_hierarchical_share_of_its_weights():
    cases = {c.name: c for c in (*cgroup_bench.CASES, cgroup_bench.BFQ_CASE)}
    assert cases["two"].shares() == [0.8333, 0.1667]
    assert cases["three"].shares() == [0.8197, 0.1639, 0.0164]
    # 200/100 at the top, 300/100 under the first
    assert [p for p, _ in cases["nested"].leaves()] == ["p0-200/c0-300", "p0-200/c1-100", "p1-100"]
    assert cases["nested"].shares() == [0.5, 0.1667, 0.3333]


def test_a_nested_case_is_a_policy_the_reconciler_reads_with_its_children(tmp_path):
    from xhagent.cgroups.policy import load_policy_text

    (tmp_path / "block/nullb0").mkdir(parents=True)
    (tmp_path / "block/nullb0/dev").write_text("250:0\n")
    nested = next(c for c in cgroup_bench.CASES if c.name == "nested")
    policy = load_policy_text(nested.policy("nullb0"), "<bench>", sys_root=tmp_path)
    got = {g.path: g.settings["io.weight"] for g in policy.groups}
    assert got == {
        "p0-200": {"default": 200, "250:0": 200},
        "p0-200/c0-300": {"default": 300, "250:0": 300},
        "p0-200/c1-100": {"default": 100, "250:0": 100},
        "p1-100": {"default": 100, "250:0": 100},
    }


def test_nullb_where_null_blk_is_missing_exits_1_naming_what_to_load(tmp_path, monkeypatch):
    from xhagent.cgroups import nullb

    if os.geteuid() != 0:
        pytest.skip("the bench refuses to start without root")
    monkeypatch.setattr(nullb, "NULLB", tmp_path / "config" / "nullb")
    monkeypatch.setattr(nullb, "load_module", lambda: None)
    res = CliRunner().invoke(main, ["bench", "cgroup-io", "--device", "nullb"])
    assert res.exit_code == 1, res.output
    assert "no null_blk: configfs is not mounted at" in res.output


def test_null_blk_is_refused_when_its_directory_is_someone_elses(tmp_path, monkeypatch):
    from xhagent.cgroups import nullb

    root = tmp_path / "nullb"
    (root / "theirs").mkdir(parents=True)
    assert nullb.available(root) is None
    with pytest.raises(nullb.NullBlkError, match="exists already: it is not this run's"):
        with nullb.null_blk("theirs", nullb.BENCH_SETTINGS, root):
            raise AssertionError("entered with another's disk")
    assert (root / "theirs").is_dir() and list((root / "theirs").iterdir()) == []
    with pytest.raises(ValueError, match="not a configfs directory name"):
        with nullb.null_blk("../x", {}, root):
            pass
