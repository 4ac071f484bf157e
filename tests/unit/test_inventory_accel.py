"""Accelerators besides NVIDIA GPUs: TPUs (accel class and vfio-bound) and generic accel-class
devices on generated trees, and this host's (none, with the reason)."""

import json
import sys
from pathlib import Path

import pynvml
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data/inventory"))
import fakes  # noqa: E402

from xhagent import node_model as model  # noqa: E402
from xhagent.config import AgentConfig  # noqa: E402
from xhagent.inventory import Roots, build_model, discover_node  # noqa: E402
from xhagent.inventory.accel import AccelDevice, read_accel  # noqa: E402
from xhagent.inventory.cli import inventory  # noqa: E402
from xhagent.inventory.render import tree  # noqa: E402
from xhagent.inventory.sysfs import LIVE_ROOTS  # noqa: E402
from xhagent.policy.placement import Demand, evaluate  # noqa: E402
from xhagent.policy.state import NodeResources  # noqa: E402


def roots(root: Path) -> Roots:
    return Roots(root / "sys", root / "proc", root / "dev")


@pytest.fixture
def no_nvml(monkeypatch):
    fakes.FakeNvml(monkeypatch, init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


@pytest.fixture
def tpu_host(tmp_path):
    fakes.server(tmp_path)
    fakes.tpu_chips(tmp_path)
    return roots(tmp_path)


def test_four_chip_tpu_host(tpu_host):
    inv = read_accel(tpu_host)
    assert inv.reason is None
    assert [(d.name, d.kind, d.model, d.pci_address, d.numa_node) for d in inv.devices] == [
        ("accel0", "tpu", "TPU v4", "0000:05:00.0", 0),
        ("accel1", "tpu", "TPU v4", "0000:06:00.0", 0),
        ("accel2", "tpu", "TPU v4", "0000:85:00.0", 1),
        ("accel3", "tpu", "TPU v4", "0000:86:00.0", 1),
    ]
    assert inv.devices[2] == AccelDevice(
        "accel2", "tpu", "TPU v4", "0000:85:00.0", 0x1AE0, 0x005E, 1, "accel", ("/dev/accel2",)
    )


def test_accel_minors_sort_numerically(tmp_path):
    fakes.tpu_chips(tmp_path, count=2, first_minor=9)  # accel9, accel10
    assert [d.name for d in read_accel(roots(tmp_path)).devices] == ["accel9", "accel10"]


def test_vfio_bound_tpu(tmp_path):
    fakes.tpu_chips(tmp_path, device=0x0027, count=2, vfio=True)
    inv = read_accel(roots(tmp_path))
    assert [(d.name, d.model, d.driver, d.device_nodes) for d in inv.devices] == [
        ("0000:05:00.0", "TPU v2/v3", "vfio-pci", ("/dev/vfio/12",)),
        ("0000:06:00.0", "TPU v2/v3", "vfio-pci", ("/dev/vfio/13",)),
    ]


def test_generic_accel_device_laid_out_as_the_kernel_does(tmp_path):
    fakes.npu(tmp_path)
    (dev,) = read_accel(roots(tmp_path)).devices
    assert dev == AccelDevice(
        "accel0",
        "accelerator",
        None,
        "0000:00:0b.0",
        0x8086,
        0x7D1D,
        None,
        "intel_vpu",
        ("/dev/accel/accel0",),
    )


def test_google_devices_that_are_not_tpus(tmp_path):
    sys_ = tmp_path / "sys"
    fakes.pci(sys_, "0000:00:04.0", 0x020000, 0x1AE0, 0x0042, 0, "gve", None)  # gVNIC
    inv = read_accel(roots(tmp_path))
    assert inv.devices == ()
    assert inv.reason == (
        f"no {sys_}/class/accel and no TPU among the PCI devices of vendor 0x1ae0 (0000:00:04.0)"
    )
    # An unknown chip id of class 0x12 (processing accelerator) is a TPU of unknown model.
    fakes.pci(sys_, "0000:00:05.0", 0x120000, 0x1AE0, 0x0099, 0, None, None)
    (tpu,) = read_accel(roots(tmp_path)).devices
    assert (tpu.name, tpu.kind, tpu.model, tpu.device_nodes) == ("0000:00:05.0", "tpu", None, ())


def test_empty_accel_class_is_said(tmp_path):
    (tmp_path / "sys/class/accel").mkdir(parents=True)
    assert read_accel(roots(tmp_path)).reason == (
        f"{tmp_path}/sys/class/accel is empty and no PCI device of vendor 0x1ae0"
    )


def _host_facts() -> tuple[list[str], list[str]]:
    """This host's accel-class entries and Google PCI functions, read without the module."""
    klass = Path("/sys/class/accel")
    entries = sorted(p.name for p in klass.iterdir()) if klass.is_dir() else []
    google = sorted(
        p.parent.name
        for p in Path("/sys/bus/pci/devices").glob("*/vendor")
        if p.read_text().strip().lower() == "0x1ae0"
    )
    return entries, google


def test_this_host():
    entries, google = _host_facts()
    inv = read_accel(LIVE_ROOTS)
    if entries or google:  # a TPU VM or a host with an accel device: all of it is found
        assert {d.name for d in inv.devices} >= set(entries)
        return
    # The development machines: no accelerator, and the inventory says why.
    assert inv.devices == ()
    assert inv.reason == "no /sys/class/accel and no PCI device of vendor 0x1ae0"
    node = build_model(discover_node(config=AgentConfig("here"), gpus=False))
    assert node.accelerators == ()
    assert str(evaluate(Demand("tpu", cpus=0), NodeResources(node))) == (
        "InsufficientTPUHardware: here has no TPU"
    )


def test_mixed_gpu_and_tpu_host(tmp_path, monkeypatch):
    fakes.gpu_box(tmp_path)
    fakes.tpu_chips(tmp_path, count=2)
    fakes.npu(tmp_path, minor=2)
    fakes.FakeNvml(monkeypatch)
    inv = discover_node(roots(tmp_path), AgentConfig("mixed"))
    node = build_model(inv)
    assert len(node.gpus) == 8
    assert [(a.index, a.kind, a.name, a.numa_node) for a in node.accelerators] == [
        (0, "tpu", "accel0", 0),
        (1, "tpu", "accel1", 1),
        (0, "accelerator", "accel2", None),
    ]
    assert [t.pci_bus_id for t in node.tpus] == ["0000:05:00.0", "0000:06:00.0"]
    assert model.load_nodes_text(model.dumps_yaml(node)) == [node]
    # The PCI list still has every function, TPUs and GPUs among them.
    vendors = [d.vendor_id for d in inv.pci]
    assert vendors.count(0x1AE0) == 2 and vendors.count(0x10DE) == 8


def test_cli_shows_accelerators(tmp_path, no_nvml):
    fakes.server(tmp_path)
    fakes.tpu_chips(tmp_path)
    args = [
        "--sysfs-root",
        str(tmp_path / "sys"),
        "--procfs-root",
        str(tmp_path / "proc"),
        "--dev-root",
        str(tmp_path / "dev"),
    ]
    runner = CliRunner()
    out = runner.invoke(inventory, [*args, "--json", "--section", "accel"])
    assert out.exit_code == 0, out.output
    accel = json.loads(out.output)["accel"]
    assert accel["reason"] is None
    assert accel["devices"][3] == {
        "name": "accel3",
        "kind": "tpu",
        "model": "TPU v4",
        "pci_address": "0000:86:00.0",
        "vendor_id": 0x1AE0,
        "device_id": 0x005E,
        "numa_node": 1,
        "driver": "accel",
        "device_nodes": ["/dev/accel3"],
        "pci_id": "1ae0:005e",
    }
    text = runner.invoke(inventory, args).output
    # Under its NUMA node, after that node's CPUs.
    line = "TPU accel2 TPU v4 (0000:85:00.0, driver accel, /dev/accel2)"
    assert line in text and text.index("NUMANode 1") < text.index(line)
    assert "No accelerators" not in text
    node = json.loads(runner.invoke(inventory, [*args, "--model", "--json"]).output)
    assert [a["name"] for a in node["accelerators"]] == ["accel0", "accel1", "accel2", "accel3"]


def test_tree_says_why_there_are_none(tmp_path, no_nvml):
    fakes.server(tmp_path)
    text = tree(discover_node(roots(tmp_path), AgentConfig("n")))
    assert f"No accelerators: no {tmp_path}/sys/class/accel and no PCI device of vendor" in text
