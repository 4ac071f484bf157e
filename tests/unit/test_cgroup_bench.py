"""`xhagent bench cgroup-io`: bad option values are refused before anything is touched, and a
stop puts io.cost and the root's controllers back."""

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from xhagent.cgroups import bench as cgroup_bench
from xhagent.cli import main


@pytest.mark.parametrize(
    "args",
    [
        ["--seconds", "nan"],
        ["--seconds", "inf"],
        ["--seconds", "0"],
        ["--threads", "0"],
        ["--threads", "100000"],
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
