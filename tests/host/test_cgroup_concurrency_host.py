"""Two writers on one subtree take turns; readers during their changes never fail."""

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from xhagent.cgroups import Cgroup, lock
from xhagent.cgroups.lock import SubtreeLock
from xhagent.cgroups.mounts import discover_hierarchy

pytestmark = pytest.mark.host

XH = Path(sys.executable).with_name("xhagent")
HEAD = "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {name: %s}\nspec:\n  groups:\n"


def policy(tmp_path, name, groups):
    """A policy of `groups` top-level groups, each with children, named after the policy."""
    body = "".join(
        f"    - name: {name}{i}\n      children: [{{name: a}}, {{name: b}}, {{name: c}}]\n"
        for i in range(groups)
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(HEAD % name + body)
    return path, {f"{name}{i}" for i in range(groups)} | {
        f"{name}{i}/{c}" for i in range(groups) for c in "abc"
    }


@pytest.fixture
def subtree():
    name = f"xhagent-test-{uuid.uuid4().hex[:8]}.slice"
    root = Path(discover_hierarchy().unified.path) / name
    yield name, root
    remove_tree(root)
    lock.lock_path(root, lock.LOCK_DIR).unlink(
        missing_ok=True
    )  # lock files are kept; this subtree is gone


def tree(root):
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}


def remove_tree(root):
    for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [
        root
    ]:
        if path.exists():
            Cgroup(path).remove(kill_first=True)


def test_two_pruning_applies_at_once_run_one_after_the_other(subtree, tmp_path):
    name, root = subtree
    files = {"alpha": policy(tmp_path, "alpha", 6), "beta": policy(tmp_path, "beta", 6)}
    for _ in range(4):
        remove_tree(root)
        procs = {
            n: subprocess.Popen(
                [str(XH), "cgroup", "apply", "--subtree", name, "--prune", "--json", "-f", str(f)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n, (f, _) in files.items()
        }
        deleted = {}
        for n, p in procs.items():
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, (n, out, err)
            assert "Traceback" not in err and "File exists" not in err
            applied = json.loads(out)["apply"]["applied"]
            deleted[n] = {a["group"] for a in applied if a["kind"] == "delete"}
        # One ran on an empty subtree; the other after it, on its whole tree: it pruned all of
        # it, and the tree is the second one's.
        (first,) = [n for n, d in deleted.items() if not d]
        (second,) = [n for n in deleted if n != first]
        assert deleted[second] == files[first][1]
        assert tree(root) == files[second][1]


def test_a_waiting_writer_says_whom_it_waits_for_and_no_wait_fails_fast(subtree, tmp_path):
    name, root = subtree
    root.mkdir()
    (root / "g").mkdir()
    with SubtreeLock(root).acquire():
        res = subprocess.run(
            [str(XH), "cgroup", "freeze", "--subtree", name, "--no-wait", "g"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 1 and "--no-wait" in res.stderr
        proc = subprocess.Popen(
            [str(XH), "cgroup", "freeze", "--subtree", name, "g"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)
        assert proc.poll() is None, "it waits while the lock is held"
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "waiting for the lock held by pid" in err
    assert Cgroup(root / "g").events()["frozen"] == 1
    Cgroup(root / "g").thaw()


def test_show_json_during_applies_never_fails(subtree, tmp_path):
    name, root = subtree
    a, _ = policy(tmp_path, "alpha", 8)
    b, _ = policy(tmp_path, "beta", 8)
    stop = threading.Event()

    def churn():
        files = [a, b]
        while not stop.is_set():
            subprocess.run(
                [str(XH), "cgroup", "apply", "--subtree", name, "--prune", "-f", str(files[0])],
                capture_output=True,
                timeout=60,
            )
            files.reverse()

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        deadline = time.monotonic() + 6
        shows = 0
        while time.monotonic() < deadline:
            res = subprocess.run(
                [str(XH), "cgroup", "show", "--subtree", name, "--json"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if res.returncode == 1 and "no group <subtree>" in res.stderr:
                continue  # before the first apply created the subtree
            assert res.returncode == 0, res.stderr
            json.loads(res.stdout)
            shows += 1
    finally:
        stop.set()
        writer.join()
    assert shows >= 3
