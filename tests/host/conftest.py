import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from xhagent.cgroups import Cgroup
from xhagent.cgroups.mounts import discover_hierarchy


def pytest_collection_modifyitems(config, items):
    # Host tests drive this kernel for real (cgroup writes, BPF, polled I/O): root only.
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="host tests need root (cgroup writes, BPF loading)")
        for item in items:
            if "host" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def raised_oom_score_adj():
    """This process's oom_score_adj raised to 300 (what its children inherit), then put back:
    raising needs no privilege, and going back down to the value it had is allowed too."""
    path = "/proc/self/oom_score_adj"
    with open(path) as f:
        before = f.read().strip()

    def write(value: str) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    write("300")
    yield 300
    write(before)


@pytest.fixture
def group():
    """A fresh group in this host's cgroup2 tree; thawed, emptied and removed afterwards."""
    root = discover_hierarchy().unified
    assert root is not None, "this host has a cgroup2 mount"
    cg = Cgroup(os.path.join(root.path, f"xhagent-test-{os.getpid()}")).create()
    yield cg
    if cg.path.exists():
        cg.write("cgroup.freeze", "0")  # never left frozen, whatever a test did
        if cg.events()["populated"]:
            cg.kill()
        cg.remove()


@pytest.fixture
def leaves(group):
    """(task leaf, shim leaf) under the scratch group; emptied and removed afterwards. Fresh
    leaves each time: a leaf once cgroup.kill'd SIGKILLs every later clone3 child on 6.18."""
    task, shim = Cgroup(group.path / "task").create(), Cgroup(group.path / "shim").create()
    yield task, shim
    for leaf in (task, shim):
        leaf.remove(kill_first=True)


REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="session")
def packages(tmp_path_factory):
    """The .deb and .rpm, built once per session by `packaging/build.py` (what `make package`
    runs): the packaging tests and the boot test share them."""
    out = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    args = [sys.executable, REPO / "packaging/build.py", "--out", out,
            "--work", tmp_path_factory.mktemp("work")]  # fmt: skip
    res = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    print(f"packages built in {time.monotonic() - started:.0f} s", file=sys.stderr)
    deb, rpm = out / f"xhagent_{VERSION}_amd64.deb", out / f"xhagent-{VERSION}.x86_64.rpm"
    assert deb.is_file() and rpm.is_file(), sorted(p.name for p in out.iterdir())
    return deb, rpm
