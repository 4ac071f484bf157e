"""Kernel tests: they need full cgroup v2 and NVMe polling, so they run inside the guest VM
that tools/vmtest boots (it sets XHAGENT_GUEST=1). Anywhere else they are skipped.

Fixtures for every kernel test: `cgroup_root`, `memory_root` / `cpu_root` (the root with
that controller enabled for its children, taken back when the test enabled it), `cgroup`
(a fresh child of the root, removed afterwards), `nvme_device`, `nvme_pattern`
(tests/kernel/pattern.py: the bytes tools/vmtest put at the start of that disk).
"""

import errno
import importlib.util
import os
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

GUEST_REASON = "kernel tests run inside the guest VM: tools/vmtest"
CGROUP_ROOT = Path("/sys/fs/cgroup")
NVME_DEVICE = Path("/dev/nvme0n1")


def pytest_runtest_setup(item):
    # A conftest's per-item hooks apply only to the items below its folder.
    if os.environ.get("XHAGENT_GUEST") != "1":
        pytest.skip(GUEST_REASON)


def _empty(path):
    return "populated 1" not in (path / "cgroup.events").read_text().splitlines()


def _wait(predicate, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def remove_cgroup(path):
    """Kill what is left in a cgroup tree, then remove it bottom-up."""
    for child in sorted((p for p in path.iterdir() if p.is_dir()), reverse=True):
        remove_cgroup(child)
    if (path / "cgroup.freeze").exists():
        (path / "cgroup.freeze").write_text("0")
    (path / "cgroup.kill").write_text("1")
    _wait(lambda: _empty(path), what=f"{path} to empty")
    _wait(lambda: _rmdir(path), what=f"rmdir {path}")


def _rmdir(path):
    # The last task can still be exiting when populated drops to 0: rmdir says EBUSY.
    try:
        path.rmdir()
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        return False
    return True


def _load_pattern():
    spec = importlib.util.spec_from_file_location(
        "xhagent_vmtest_pattern", Path(__file__).with_name("pattern.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cgroup_root():
    with open("/proc/self/mounts") as mounts:
        fstypes = [f[2] for f in (line.split() for line in mounts) if f[1] == str(CGROUP_ROOT)]
    assert fstypes and fstypes[-1] == "cgroup2", f"{CGROUP_ROOT} is not a cgroup2 mount"
    return CGROUP_ROOT


@contextmanager
def controller_enabled(root, controller):
    """`controller` in the root's subtree_control for the block; disabled again afterwards
    only when this enabled it."""
    control = root / "cgroup.subtree_control"
    added = controller not in control.read_text().split()
    if added:
        control.write_text(f"+{controller}")
    try:
        yield root
    finally:
        if added:
            control.write_text(f"-{controller}")


@pytest.fixture
def memory_root(cgroup_root):
    with controller_enabled(cgroup_root, "memory"):
        yield cgroup_root


@pytest.fixture
def cpu_root(cgroup_root):
    with controller_enabled(cgroup_root, "cpu"):
        yield cgroup_root


@pytest.fixture
def cgroup(cgroup_root):
    path = cgroup_root / f"xhagent-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    yield path
    remove_cgroup(path)


@pytest.fixture
def nvme_device():
    assert NVME_DEVICE.is_block_device(), f"{NVME_DEVICE} is missing: tools/vmtest attaches it"
    return NVME_DEVICE


@pytest.fixture(scope="session")
def nvme_pattern():
    return _load_pattern()
