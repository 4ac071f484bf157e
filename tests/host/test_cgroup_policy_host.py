"""`xhagent cgroup` on this host's cgroup2 tree (hybrid: hugetlb only), for real."""

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from xhagent.cgroups import Cgroup, lock, registry
from xhagent.cgroups.mounts import discover_hierarchy

pytestmark = pytest.mark.host

BUSY = "while True: pass\n"
POLICY = """\
apiVersion: xh.scheduling/v1
kind: CgroupPolicy
metadata: {name: host}
spec:
  groups:
    - name: work
      children: [{name: busy}]
"""


@pytest.fixture
def subtree(tmp_path):
    """A throwaway subtree name and the CLI bound to it; everything removed afterwards."""
    name = f"xhagent-test-{uuid.uuid4().hex[:8]}.slice"
    root = Path(discover_hierarchy().unified.path) / name
    xh = Path(os.sys.executable).with_name("xhagent")

    def cli(*args, **kw):
        return subprocess.run(
            [str(xh), "cgroup", "--subtree", name, *args],
            capture_output=True,
            text=True,
            timeout=60,
            **kw,
        )

    cli.root, cli.xh, cli.name = root, xh, name
    yield cli
    for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [
        root
    ]:
        if path.exists():
            Cgroup(path).remove(kill_first=True)
    lock.lock_path(root, lock.LOCK_DIR).unlink(
        missing_ok=True
    )  # lock files are kept; this subtree is gone


def usage(group):
    return Cgroup(group).get(registry.CPU_STAT)["usage_usec"]


def wait_for(predicate, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_apply_run_freeze_thaw_kill_prune(subtree, tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY)
    res = subtree("apply", "-f", str(policy))
    assert res.returncode == 0, res.stderr
    assert (subtree.root / "work/busy").is_dir()
    assert "nothing to do" in subtree("apply", "-f", str(policy)).stdout  # idempotent

    runner = subprocess.Popen(
        [
            str(subtree.xh),
            "cgroup",
            "--subtree",
            subtree.name,
            "run",
            "work/busy",
            "--",
            os.sys.executable,
            "-c",
            BUSY,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    group = subtree.root / "work/busy"
    try:
        wait_for(lambda: Cgroup(group).procs(), "the busy process to join work/busy")
        time.sleep(0.2)
        assert subtree("freeze", "work/busy").returncode == 0
        frozen_at = usage(group)
        time.sleep(0.5)
        assert usage(group) - frozen_at < 20_000, "a frozen group's CPU time must stop advancing"
        assert subtree("thaw", "work/busy").returncode == 0
        thawed_at = usage(group)
        time.sleep(0.5)
        assert usage(group) - thawed_at > 50_000, "a thawed busy loop must use CPU again"

        shown = json.loads(subtree("show", "work", "--json").stdout)
        assert shown["groups"]["work/busy"]["events"]["populated"] == 1
        assert shown["groups"]["work/busy"]["stats"]["cpu.stat"]["usage_usec"] > 0

        res = subtree("kill", "work/busy")
        assert res.returncode == 0 and "populated=0" in res.stdout, res.stderr
        assert runner.wait(timeout=10) == 128 + 9
    finally:
        if runner.poll() is None:
            runner.kill()
    policy.write_text(POLICY.replace("      children: [{name: busy}]\n", ""))
    res = subtree("apply", "--prune", "-f", str(policy), "--json")
    assert res.returncode == 0, res.stderr
    assert [a["group"] for a in json.loads(res.stdout)["apply"]["applied"]] == ["work/busy"]
    assert not group.exists()


def test_cpu_and_io_settings_are_reported_unsupported_and_nothing_is_applied(subtree, tmp_path):
    if {"cpu", "io"} <= set(Cgroup(discover_hierarchy().unified.path).controllers()):
        pytest.skip("this host's cgroup2 has cpu and io: the hybrid host case does not apply")
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY + "      cpu: {weight: 400}\n      io: {weight: 500}\n")
    for cmd in ("plan", "apply"):
        res = subtree(cmd, "-f", str(policy))
        assert res.returncode == 1, res.stdout + res.stderr
        assert "controller cpu is not available in cgroup2 on this node" in res.stdout
        assert "controller io is not available" in res.stdout and f"{policy}:9:" in res.stdout
        assert "Traceback" not in res.stderr
    assert "nothing applied" in res.stderr
    assert not subtree.root.exists()


def test_run_into_a_missing_group_and_escapes_fail_cleanly(subtree):
    res = subtree("run", "nope", "--", "true")
    assert res.returncode == 1 and "no group nope" in res.stderr
    res = subtree("freeze", "../init.scope")
    assert res.returncode == 1 and "not a group name" in res.stderr


def test_the_kernels_depth_limit_is_a_plan_error_and_nothing_is_half_applied(subtree, tmp_path):
    subtree.root.mkdir()
    (subtree.root / registry.MAX_DEPTH.name).write_text("1\n")
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY)
    for cmd in ("plan", "apply"):
        res = subtree(cmd, "-f", str(policy))
        assert res.returncode == 1, res.stdout + res.stderr
        assert (
            f"{policy}:7:25: group work/busy would be 2 levels below {subtree.root}, "
            "whose cgroup.max.depth is 1" in res.stdout
        )
    assert not (subtree.root / "work").exists()


def test_the_shipped_example_on_a_node_without_its_device_is_unsupported_here_not_bad_input(
    subtree,
):
    example = Path(__file__).resolve().parents[2] / "configs/examples/cgroup-policy.yaml"
    if Path("/sys/block/nvme0n1").exists():
        pytest.skip("this node has nvme0n1")
    res = subtree("plan", "-f", str(example))
    assert res.returncode == 1, res.stderr
    assert (
        "no block device 'nvme0n1' on this node" in res.stdout and "unsupported here" in res.stdout
    )
