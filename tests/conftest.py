"""Fixtures shared by the host, kernel and gpu tests, and NVML's stand-in, the unit tests' too."""

import contextlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

XHAGENT = Path(sys.executable).with_name("xhagent")


def xhagent(*args, timeout=120):
    """Run the installed `xhagent` CLI; a CompletedProcess with text output."""
    return subprocess.run([str(XHAGENT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def run_xhagent():
    return xhagent


@pytest.fixture(scope="module")
def doctor_report():
    """`xhagent doctor --json` run once per module, as its items."""
    res = xhagent("doctor", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["items"]


class StandInNvml:
    """pynvml as the agent uses it (daemon/loop/nvml.py), for GPU-0 alone: `utilisation`
    percent busy, and the compute `processes` as (pid, bytes used or None)."""

    class NVMLError(Exception):
        pass

    inits = 0
    utilisation = 90
    processes: list = []

    @classmethod
    def nvmlInit(cls):
        cls.inits += 1

    @classmethod
    def nvmlDeviceGetHandleByUUID(cls, uuid):
        if uuid != "GPU-0":
            raise cls.NVMLError("NVMLError_NotFound")
        return uuid

    @classmethod
    def nvmlDeviceGetUtilizationRates(cls, handle):
        return types.SimpleNamespace(gpu=cls.utilisation, memory=10)

    @classmethod
    def nvmlDeviceGetComputeRunningProcesses(cls, handle):
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in cls.processes]


@pytest.fixture
def standin_nvml(tmp_path, monkeypatch):
    """pynvml's stand-in imported in its place, and an `Nvml` that finds the NVIDIA driver
    bound (under a scratch sys root): (the stand-in, the Nvml)."""
    from xhagent.daemon.loop.nvml import Nvml

    (tmp_path / "standin-sys/bus/pci/drivers/nvidia").mkdir(parents=True)
    monkeypatch.setitem(sys.modules, "pynvml", StandInNvml)
    monkeypatch.setattr(StandInNvml, "inits", 0)
    monkeypatch.setattr(StandInNvml, "processes", [])
    return StandInNvml, Nvml(sys_root=tmp_path / "standin-sys")


@pytest.fixture
def scratch_scheduler():
    """`scheduler_on_this_kernel`, for a test's `with`."""
    return scheduler_on_this_kernel


@contextlib.contextmanager
def scheduler_on_this_kernel(tmp_path: Path, node, policies: list, name: str):
    """The agent's scheduler core on this host's kernel, for `node` (a model: its devices
    may exist only there) under `policies`: a real store in `tmp_path`, a real executor in
    the scratch subtree `name` and its shims. After: what still runs killed, the subtree
    removed."""
    from xhagent.cgroups.subtree import locate
    from xhagent.daemon.exec.executor import Executor
    from xhagent.daemon.loop.scheduler import Scheduler
    from xhagent.daemon.loop.submission import parse_submission
    from xhagent.daemon.store import Store, TaskState

    sub = locate(name)
    store = Store.open(tmp_path / "state")
    executor = Executor(sub, tmp_path / "state", 1 << 20)
    executor.prepare()
    try:
        yield Scheduler(store, executor, node, parse_submission, lambda: policies)
    finally:
        for rec in store.list_tasks([TaskState.RUNNING, TaskState.STARTING], limit=1000):
            executor.kill(rec.id)
        store.close()
        executor.close()  # its shim server ends
        for rel in reversed(sub.walk()):
            sub.group(rel).remove(kill_first=True)
        sub.root.remove()
