"""On a machine with an NVIDIA GPU: the dwps memory model takes a task's size on the GPU's
line from what NVML says its real process uses. The task reserves 1 GiB and its workload
allocates 3 GiB through the CUDA driver; the task's allocation on the line grows to at
least that, its process found in the task by its cgroup."""

import ctypes.util
import os
import sys
import time
from pathlib import Path

import pytest

from xhagent.daemon.policies.sources import parse_source
from xhagent.daemon.store import TaskState
from xhagent.inventory import build_model, discover_node

pytestmark = pytest.mark.gpu

GIB = 1 << 30
EXAMPLE = Path(__file__).resolve().parents[2] / "configs/examples/queueing-dwps.yaml"
# allocates 3 GiB on the first visible GPU through the driver API, says so, and holds it
WORKLOAD = """import ctypes, pathlib, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(3 << 30)) == 0
pathlib.Path(sys.argv[1]).touch()
time.sleep(600)
"""


@pytest.fixture
def agent(tmp_path, scratch_scheduler):
    if not ctypes.util.find_library("cuda") or not ctypes.util.find_library("nvidia-ml"):
        pytest.skip("no NVIDIA GPU driver (libcuda, libnvidia-ml) on this machine")
    node = build_model(discover_node())
    if not node.gpus:
        pytest.skip("no NVIDIA GPU in this machine's inventory")
    policy = parse_source(EXAMPLE.read_text(), str(EXAMPLE))[0].value
    with scratch_scheduler(
        tmp_path, node, [policy], f"xhagent-dwps-gpu-test-{os.getpid()}.slice"
    ) as a:
        yield a


def test_a_tasks_place_on_the_line_follows_what_its_process_uses(agent, tmp_path):
    script, ready = tmp_path / "alloc.py", tmp_path / "ready"
    script.write_text(WORKLOAD)
    doc = f"""apiVersion: xh.scheduling/v1
kind: Task
metadata: {{name: alloc, labels: {{gpu: shared}}}}
spec:
  deviceType: gpu
  command: [{sys.executable}, {script}, {ready}]
  requests: {{gpus: 1, gpuMemory: 1GiB}}
"""
    (rec,) = agent.submit(doc, "alloc.yaml")
    deadline = time.monotonic() + 60
    while not ready.exists():
        agent.step()
        assert agent.get(rec.id).state in (TaskState.PENDING, TaskState.STARTING, TaskState.RUNNING)
        assert time.monotonic() < deadline, "the workload did not allocate in 60 s"
        time.sleep(0.1)
    (gpu,) = agent.get(rec.id).placement.gpus
    agent.gpu_memory.sample()
    agent.step()
    allocation = agent.gpu_memory.lines[gpu.index].by_owner[rec.id]
    assert allocation.size >= 3 * GIB, allocation  # NVML's use, past the 1 GiB reserved
