"""On a machine with an NVIDIA GPU: the inventory's GPU entries agree with nvidia-smi."""

import ctypes.util
import json
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.gpu

FIELDS = "index,uuid,name,memory.total,pci.bus_id,compute_cap"


@pytest.fixture(scope="module")
def smi():
    if not ctypes.util.find_library("nvidia-ml") or not shutil.which("nvidia-smi"):
        pytest.skip("no NVIDIA GPU driver (libnvidia-ml, nvidia-smi) on this machine")
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[f.strip() for f in line.split(",")] for line in out.strip().splitlines()]


def test_gpus_match_nvidia_smi(smi, run_xhagent):
    res = run_xhagent("inventory", "--json", "--section", "gpu")
    assert res.returncode == 0, res.stderr
    gpu = json.loads(res.stdout)["gpu"]
    assert gpu["nvml"]["available"], gpu["nvml"]
    assert len(gpu["gpus"]) == len(smi)
    for ours, (index, uuid, name, mem_mib, bus, cc) in zip(gpu["gpus"], smi, strict=True):
        assert (ours["index"], ours["uuid"], ours["name"]) == (int(index), uuid, name)
        assert ours["memory_total"] // (1 << 20) == int(mem_mib)
        assert ours["pci_bus_id"] == bus.lower()[4:]  # nvidia-smi: 00000000:18:00.0
        assert ours["compute_capability"] == cc


def test_model_has_cuda_version(smi, run_xhagent):
    from xhagent import node_model as model

    res = run_xhagent("inventory", "--model")
    assert res.returncode == 0, res.stderr
    (node,) = model.load_nodes_text(res.stdout)
    assert len(node.gpus) == len(smi) and node.gpus[0].cuda_driver_version.major >= 10
