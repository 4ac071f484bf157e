"""Accelerators besides NVIDIA GPUs: TPUs (accel class and vfio-bound) and generic accel-class
devices on generated trees, this host's (none, with the reason), and placement of TPU tasks on
the model built from them."""

import json
import sys
from pathlib import Path

import pynvml
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "data/inventory"))
import fakes  # noqa: E402

from xhagent import node_model as model  # noqa: E402
from xhagent.config import AgentConfig  # noqa: E402
from xhagent.inventory import Roots, build_model, discover_node  # noqa: E402
from xhagent.inventory.accel import AccelDevice, read_accel  # noqa: E402
from xhagent.inventory.cli import inventory  # noqa: E402
from xhagent.inventory.render import tree  # noqa: E402
from xhagent.inventory.sysfs import LIVE_ROOTS  # noqa: E402
from xhagent.policy.placement import Candidate, Demand, Reason, decide_demand, evaluate  # noqa: E402
from xhagent.policy.state import Allocation, Cluster, NodeResources  # noqa: E402


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
    # Placement: the GPU task gets GPUs and no chip, the TPU task a chip and no GPU.
    cluster = Cluster.of([node])
    gpu = decide_demand("g", Demand("gpu", cpus=2, gpus=2), cluster).placed
    tpu = decide_demand("t", Demand("tpu", cpus=2), cluster).placed
    assert len(gpu.gpus) == 2 and gpu.tpus == ()
    assert tpu.gpus == () and tpu.tpus == (0,)
    # Its CPUs are on the chip's NUMA node (chip 0 is on node 0: CPUs 0-3, 8-11).
    assert set(tpu.cpus) <= {0, 1, 2, 3, 8, 9, 10, 11}


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


# ------------------------------------------------------------------------- placement


def tpu_node(name="t1", chips=4, others=()) -> model.Node:
    """Two NUMA nodes of 4 CPUs; `chips` TPU v4 chips split over them; `others`: accelerators."""
    numa = [
        {
            "id": n,
            "l3": [
                {
                    "id": n,
                    "cores": [
                        {"id": c, "package": n, "cpus": [c]} for c in range(4 * n, 4 * n + 4)
                    ],
                }
            ],
        }
        for n in range(2)
    ]
    accel = [
        {
            "index": i,
            "kind": "tpu",
            "name": f"accel{i}",
            "model": "TPU v4",
            "numaNode": i * 2 // chips,
        }
        for i in range(chips)
    ] + [{"index": i, "kind": "accelerator", "name": o} for i, o in enumerate(others)]
    return model.Node.from_dict(
        {
            "name": name,
            "numa": numa,
            "memory": {"total": 64 << 30, "available": 64 << 30},
            "accelerators": accel,
        }
    )


def test_tpu_task_fits_on_a_tpu_node_and_not_elsewhere():
    d = Demand("tpu", cpus=2)
    placed = evaluate(d, NodeResources(tpu_node()))
    assert isinstance(placed, Candidate) and placed.tpus == (0,) and len(placed.cpus) == 2
    cpu_only = tpu_node("c1", chips=0)
    assert str(evaluate(d, NodeResources(cpu_only))) == "InsufficientTPUHardware: c1 has no TPU"
    npu_only = tpu_node("c2", chips=0, others=["accel0"])
    assert str(evaluate(d, NodeResources(npu_only))) == (
        "InsufficientTPUHardware: c2 has no TPU (has accel0)"
    )
    # A CPU task never takes a chip.
    assert evaluate(Demand("cpu", cpus=1), NodeResources(tpu_node())).tpus == ()


def test_chips_are_held_until_released():
    cluster = Cluster.of([tpu_node(chips=2)])
    for task in ("a", "b"):
        c = decide_demand(task, Demand("tpu", cpus=1), cluster).placed
        cluster.commit(Allocation(task, c.node, c.cpus, c.memory, c.gpus, (), c.tpus))
    full = decide_demand("c", Demand("tpu", cpus=1), cluster)
    assert full.pending and [str(r) for r in full.reasons] == [
        "InsufficientTPUHardware: t1 has 0 free TPU chips of 2 (TPU v4), task needs 1"
    ]
    with pytest.raises(ValueError, match=r"TPU chips \[0\] on t1 are already held"):
        cluster.commit(Allocation("x", "t1", (), 0, tpus=(0,)))
    cluster.release("a")
    assert decide_demand("c", Demand("tpu", cpus=1), cluster).placed.tpus == (0,)


def test_demand_of_a_tpu_task_asks_for_one_chip():
    assert Demand("tpu", cpus=1).tpu_chips == 1
    assert Demand("gpu", cpus=1, gpus=1).tpu_chips == 0
    reason = evaluate(Demand("tpu", cpus=1, tpus=3), NodeResources(tpu_node(chips=2)))
    assert isinstance(reason, Reason) and reason.detail.endswith("task needs 3")


@settings(max_examples=60, deadline=None)
@given(chips=st.integers(0, 4), tasks=st.integers(1, 6), numa_pref=st.booleans())
def test_no_chip_is_ever_given_twice(chips, tasks, numa_pref):
    cluster = Cluster.of([tpu_node(chips=chips)])
    given_out = []
    for i in range(tasks):
        d = Demand("tpu", cpus=1, numa_single=numa_pref)
        c = decide_demand(f"t{i}", d, cluster).placed
        if c is None:
            break
        cluster.commit(Allocation(f"t{i}", c.node, c.cpus, 0, (), (), c.tpus))
        given_out += c.tpus
    assert len(given_out) == len(set(given_out)) == min(chips, tasks)


def test_cpus_follow_the_chip_to_its_numa_node():
    cluster = Cluster.of([tpu_node(chips=2)])  # chip 0 on NUMA node 0 (CPUs 0-3), chip 1 on 1
    cluster.commit(Allocation("a", "t1", (0,), 0, tpus=(0,)))
    c = decide_demand("b", Demand("tpu", cpus=2), cluster).placed
    assert c.tpus == (1,) and set(c.cpus) <= {4, 5, 6, 7}
