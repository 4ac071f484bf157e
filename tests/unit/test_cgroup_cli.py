"""`xhagent cgroup` input errors: FILE:LINE:COL on stderr, exit 2, no traceback."""
from click.testing import CliRunner

from xhagent.cli import main


def test_bad_policy_exits_2_with_location(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nspec:\n  groups:\n    - name: a\n      cpu: {weight: 20000}\n")
    for cmd in ("plan", "apply"):
        res = CliRunner().invoke(main, ["cgroup", cmd, "-f", str(bad)])
        assert res.exit_code == 2, res.output
        assert f"{bad}:6:21: spec.groups.0.cpu.weight: 20000 is not a valid weight (1..10000)" in res.output
        assert "Traceback" not in res.output


def test_missing_file_and_run_without_command(tmp_path):
    res = CliRunner().invoke(main, ["cgroup", "plan", "-f", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2 and "nope.yaml:1:1: cannot read" in res.output
    res = CliRunner().invoke(main, ["cgroup", "run", "g"])
    assert res.exit_code == 2 and "Missing argument" in res.output
