"""Subtree discovery on this host's cgroup2 tree, and a delegated unit cgroup settled for real."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from xhagent.cgroups import Cgroup, delegation, lock
from xhagent.cgroups.mounts import discover_hierarchy, own_cgroup
from xhagent.cgroups.subtree import locate

pytestmark = pytest.mark.host


def test_discovery_agrees_with_proc_and_mountinfo():
    mount = Path(discover_hierarchy().unified.path)
    own = own_cgroup()  # the 0:: line of /proc/self/cgroup
    systemd = (mount / "init.scope").is_dir() or Path("/run/systemd/system").is_dir()
    marked = own != "/" and delegation.read_delegate_mark(mount / own.strip("/"))
    if not marked and systemd:
        with pytest.raises(delegation.DelegationError, match="Delegate=yes"):
            locate()
        return
    sub = locate()
    assert sub.mount == mount
    if marked:
        assert (sub.rel, sub.placement.how) == (own.strip("/"), "delegated")
    else:  # this development host: no systemd, own cgroup /
        assert (sub.rel, sub.placement.how, sub.agent_leaf) == ("xhagent.slice", "default", "")


@pytest.fixture
def unit():
    """A unit-like cgroup with a sleeping process in it; removed with everything below it."""
    mount = Path(discover_hierarchy().unified.path)
    cg = Cgroup(mount / f"xhagent-test-{uuid.uuid4().hex[:8]}.service").create()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    cg.add_proc(child.pid)
    yield mount, cg, child
    child.kill()
    child.wait()
    for path in sorted(
        (p for p in cg.path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
    ) + [cg.path]:
        if path.exists():
            Cgroup(path).remove(kill_first=True)
    lock.lock_path(cg.path, lock.LOCK_DIR).unlink(
        missing_ok=True
    )  # lock files are kept; this unit is gone


def test_a_delegated_unit_cgroup_is_found_and_its_process_moved_into_the_leaf(unit, tmp_path):
    mount, cg, child = unit
    proc = f"/proc/{child.pid}/cgroup"
    rel = cg.path.name
    systemd_run = tmp_path / "run-systemd-system"  # as if systemd were init
    systemd_run.mkdir()
    with pytest.raises(delegation.DelegationError, match="Delegate=yes"):
        delegation.discover_placement(mount, proc_cgroup=proc, run_dir=systemd_run)

    os.setxattr(cg.path, "trusted.delegate", b"1")  # what systemd writes for Delegate=yes
    assert delegation.read_delegate_mark(cg.path) is True
    placement = delegation.discover_placement(mount, proc_cgroup=proc, run_dir=systemd_run)
    assert (placement.rel, placement.how, placement.leaf) == (rel, "delegated", "agent.leaf")
    assert delegation.pending(mount, placement) == [child.pid]

    assert delegation.settle(mount, placement) == [child.pid]
    assert Path(proc).read_text().strip().endswith(f"::/{rel}/agent.leaf")
    assert cg.procs() == [] and Cgroup(cg.path / "agent.leaf").procs() == [child.pid]
    assert delegation.settle(mount, placement) == []  # once only

    again = delegation.discover_placement(mount, proc_cgroup=proc, run_dir=systemd_run)
    assert (again.rel, again.leaf) == (rel, "agent.leaf")


def test_cli_plan_says_where_and_why(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {name: where}\n"
        "spec:\n  groups:\n    - name: work\n"
    )
    xh = Path(sys.executable).with_name("xhagent")
    name = f"xhagent-test-{uuid.uuid4().hex[:8]}.slice"
    res = subprocess.run(
        [str(xh), "cgroup", "--subtree", name, "plan", "-f", str(policy), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    where = json.loads(res.stdout)["where"]
    assert where["how"] == "option" and name in where["why"] and where["subtree"].endswith(name)
    res = subprocess.run(
        [str(xh), "cgroup", "plan", "-f", str(policy)], capture_output=True, text=True, timeout=60
    )
    expected = locate().placement
    assert res.returncode == 0, res.stderr
    assert f"  where: {expected.how}: {expected.why}" in res.stdout
    assert not (Path(discover_hierarchy().unified.path) / name).exists()  # plan writes nothing


def test_cli_apply_inside_a_delegated_unit_settles_then_creates_siblings(unit, tmp_path):
    mount, cg, _ = unit
    os.setxattr(cg.path, "trusted.delegate", b"1")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {name: unit}\n"
        "spec:\n  groups:\n    - name: work\n"
    )
    xh = str(Path(sys.executable).with_name("xhagent"))
    # The CLI joins the unit cgroup before it starts, as a service's main process would be there.
    join = (
        "import os, sys; open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid())); "
        "os.execv(sys.argv[2], sys.argv[2:])"
    )
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            join,
            str(cg.path),
            xh,
            "cgroup",
            "apply",
            "-f",
            str(policy),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["where"]["how"] == "delegated" and out["subtree"] == str(cg.path)
    assert f"into {cg.path / 'agent.leaf'}" in res.stderr
    assert [a["kind"] for a in out["apply"]["applied"]] == ["create"] and (
        cg.path / "work"
    ).is_dir()
    # Every process of the unit went to the leaf (the sleeper too); the unit cgroup is an inner
    # node now.
    assert cg.procs() == [] and Cgroup(cg.path / "agent.leaf").procs() == [unit[2].pid]
