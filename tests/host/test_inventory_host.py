"""This machine's inventory agrees with /proc/cpuinfo, lscpu and lsblk, and names NVML's absence."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.host


@pytest.fixture(scope="module")
def inv(run_xhagent):
    res = run_xhagent("inventory", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_cpus_match_proc_cpuinfo_and_lscpu(inv):
    with open("/proc/cpuinfo") as f:
        processors = [int(line.split(":")[1]) for line in f if line.startswith("processor")]
    assert inv["cpu"]["online"] == processors
    if not shutil.which("lscpu"):
        pytest.skip("lscpu (util-linux) not installed")
    rows = json.loads(
        subprocess.run(
            ["lscpu", "-J", "-e=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True, check=True
        ).stdout
    )["cpus"]
    ours = {c["id"]: c for c in inv["cpu"]["cpus"]}
    for row in rows:
        cpu = ours[int(row["cpu"])]
        assert cpu["package"] == int(row["socket"])
        if row.get("node") is not None:
            assert cpu["numa_node"] == int(row["node"])


def test_block_devices_match_lsblk(inv):
    rows = json.loads(
        subprocess.run(
            ["lsblk", "-J", "-d", "-b", "-o", "NAME,MAJ:MIN,SIZE,ROTA,SCHED"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["blockdevices"]
    lsblk = {r["name"]: r for r in rows if int(r["size"]) > 0}
    ours = {d["name"]: d for d in inv["block"]}
    assert set(ours) == set(lsblk)
    for name, row in lsblk.items():
        assert (ours[name]["dev"], ours[name]["size_bytes"], ours[name]["rotational"]) == (
            row["maj:min"],
            int(row["size"]),
            bool(row["rota"]),
        )
    if "vda" in ours:
        assert ours["vda"]["io_poll"] == 0


def test_nvml_unavailable_with_its_reason(inv):
    if Path("/sys/bus/pci/drivers/nvidia").is_dir():
        pytest.skip("this machine has the NVIDIA driver: see tests/gpu")
    assert inv["gpu"]["gpus"] == []
    assert inv["gpu"]["nvml"]["available"] is False
    # no driver bound, so NVML is not even loaded
    assert inv["gpu"]["nvml"]["reason"] == "no NVIDIA driver: /sys/bus/pci/drivers/nvidia absent"


def test_model_loads_back(run_xhagent):
    from xhagent import node_model as model

    res = run_xhagent("inventory", "--model")
    assert res.returncode == 0, res.stderr
    (node,) = model.load_nodes_text(res.stdout, "<xhagent inventory --model>")
    assert node.allocatable_cpus and node.memory.total > 0
