"""Inventory of recorded trees: a 2-socket SMT server and an 8-GPU box (NVML faked per function)."""

import json
import sys
from pathlib import Path

import pynvml
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data/inventory"))
import fakes  # noqa: E402

from xhagent import node_model as model  # noqa: E402
from xhagent.config import AgentConfig, ConfigError, parse_config  # noqa: E402
from xhagent.inventory import Roots, build_model, discover_node  # noqa: E402
from xhagent.inventory.cpus import read_cpus  # noqa: E402
from xhagent.inventory.gpus import read_gpus  # noqa: E402
from xhagent.inventory.pci import PciIds, read_pci  # noqa: E402
from xhagent.inventory.render import as_dict, nvlink_matrix, tree  # noqa: E402


@pytest.fixture
def server(tmp_path):
    sys_, proc = fakes.server(tmp_path)
    return Roots(sys_, proc, tmp_path / "dev")


@pytest.fixture
def no_nvml(monkeypatch):
    fakes.FakeNvml(monkeypatch, init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def test_cpu_topology_and_cache_sharing(server):
    inv = read_cpus(server)
    cpu9 = next(c for c in inv.cpus if c.id == 9)
    assert (cpu9.package, cpu9.core, cpu9.numa_node, cpu9.siblings) == (0, 1, 0, (1, 9))
    assert inv.cache_of(cpu9, "L3").cpus == (0, 1, 2, 3, 8, 9, 10, 11)
    assert (
        inv.cache_of(cpu9, "L2").cpus == (1, 9) and inv.cache_of(cpu9, "L2").size_bytes == 2 << 20
    )
    assert [k for k in inv.caches if k.startswith("L3")] == ["L3:0", "L3:1"]
    assert inv.caches["L3:1"].cpus == (4, 5, 6, 7, 12, 13, 14, 15)
    assert len([k for k in inv.caches if k.startswith("L1d")]) == 8
    assert inv.allowed == tuple(range(16))


def test_offline_cpu_is_listed_but_not_allocatable(tmp_path, no_nvml):
    sys_, proc = fakes.server(tmp_path, online="0-12,14-15")
    inv = discover_node(Roots(sys_, proc, tmp_path), AgentConfig("n"))
    assert [c.id for c in inv.cpu.cpus if not c.online] == [13]
    node = build_model(inv)
    assert 13 not in node.allocatable_cpus
    core5 = next(c for _, _, c in node.cores() if c.package == 1 and c.id == 1)
    assert core5.cpus == (5,) and core5.siblings == (5,)  # the kernel drops offline siblings


def test_numa_memory_hugepages_and_block(server, no_nvml):
    inv = discover_node(server, AgentConfig("n"))
    assert [(n.id, n.cpus, n.distances) for n in inv.numa] == [
        (0, (0, 1, 2, 3, 8, 9, 10, 11), {0: 10, 1: 21}),
        (1, (4, 5, 6, 7, 12, 13, 14, 15), {0: 21, 1: 10}),
    ]
    assert inv.numa[1].memory_total == 64 << 30 and inv.numa[1].memory_free == 60 << 30
    assert (inv.memory.total, inv.memory.available) == (128 << 30, 124 << 30)
    assert [(h.size_bytes, h.total, h.free) for h in inv.memory.hugepages] == [
        (2 << 20, 512, 500),
        (1 << 30, 4, 4),
    ]
    assert [
        (
            d.name,
            d.dev,
            d.rotational,
            d.scheduler,
            d.io_poll,
            d.poll_queues,
            d.numa_node,
            d.logical_block,
        )
        for d in inv.block
    ] == [
        ("nvme0n1", "259:0", False, "none", 1, 4, 1, 4096),
        ("sda", "8:0", True, "mq-deadline", 0, 0, 0, 512),
    ]
    assert inv.block[0].open_error.startswith(f"cannot open {server.dev}/nvme0n1: -ENOENT")
    assert inv.gpu.available is False
    assert inv.gpu.reason == f"no NVIDIA driver: {server.sys}/bus/pci/drivers/nvidia absent"


def test_nvml_says_why_when_the_driver_is_bound_but_nvml_fails(tmp_path, no_nvml):
    sys_, proc = fakes.gpu_box(tmp_path)
    inv = read_gpus(Roots(sys_, proc))
    assert (inv.available, inv.reason, inv.gpus) == (
        False,
        "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
        (),
    )


def test_pci_devices_with_names(server):
    ids = PciIds.parse(
        "144d  Samsung Electronics Co Ltd\n\ta824  NVMe SSD Controller PM173X\n"
        "C 01  Mass storage controller\n\t08  Non-Volatile memory controller\n"
    )
    nvme = read_pci(server, ids)[1]
    assert (
        nvme.address,
        nvme.class_id,
        nvme.vendor_id,
        nvme.device_id,
        nvme.numa_node,
        nvme.driver,
    ) == ("0000:5e:00.0", 0x010802, 0x144D, 0xA824, 1, "nvme")
    assert (nvme.link_speed, nvme.link_width) == ("16.0 GT/s PCIe", 4)
    assert (nvme.vendor_name, nvme.device_name, nvme.class_name) == (
        "Samsung Electronics Co Ltd",
        "NVMe SSD Controller PM173X",
        "Non-Volatile memory controller",
    )
    assert read_pci(server, None)[0].driver is None


def test_model_groups_numa_l3_cores_and_keeps_reserved_out(server, no_nvml):
    config = parse_config(
        'nodeName: s1\nlabels: {rack: r1, zone: z1, pool: batch}\nreservedCpus: "0,8"\n', "a.yaml"
    )
    node = build_model(discover_node(server, config))
    assert node.name == "s1" and node.labels.as_dict() == {
        "rack": "r1",
        "zone": "z1",
        "pool": "batch",
    }
    assert node.reserved_cpus == (0, 8)
    assert [(n.id, [d.id for d in n.l3]) for n in node.numa] == [(0, [0]), (1, [1])]
    dom0 = node.numa[0].l3[0]
    assert dom0.size_bytes == 32 << 20 and dom0.cpus == (1, 2, 3, 9, 10, 11)
    assert [(c.id, c.cpus, c.siblings) for c in dom0.cores] == [
        (1, (1, 9), (1, 9)),
        (2, (2, 10), (2, 10)),
        (3, (3, 11), (3, 11)),
    ]  # core 0 fully reserved
    assert node.numa[1].l3[0].cores[0].whole
    assert [(d.name, d.io_class, d.numa_node) for d in node.io] == [
        ("nvme0n1", "polled", 1),
        ("sda", "rotational", 0),
    ]
    assert model.load_nodes_text(model.dumps_yaml(node)) == [node]


def test_model_reserving_one_sibling_breaks_the_core(server, no_nvml):
    node = build_model(discover_node(server, AgentConfig("n", reserved_cpus=(8,))))
    core0 = node.numa[0].l3[0].cores[0]
    assert (core0.cpus, core0.siblings, core0.whole) == ((0,), (0, 8), False)


def test_eight_gpu_box_nvlink_islands(tmp_path, monkeypatch):
    sys_, proc = fakes.gpu_box(tmp_path)
    fakes.FakeNvml(monkeypatch)
    inv = discover_node(Roots(sys_, proc, tmp_path), AgentConfig("dgx"))
    gpu = inv.gpu
    assert (
        gpu.available and gpu.driver_version == "550.54.15" and gpu.cuda_driver_version == (12, 4)
    )
    g5 = gpu.gpus[5]
    assert (g5.pci_bus_id, g5.numa_node, g5.nvlink_up, g5.nvlink_links) == (
        "0000:ab:00.0",
        1,
        6,
        {4: 2, 6: 2, 7: 2},
    )
    assert (g5.memory_total, g5.memory_used, g5.compute_capability) == (
        85520809984,
        6 << 30,
        (9, 0),
    )
    assert (gpu.gpus[0].processes, g5.processes, g5.mig_mode) == (1, 0, False)
    assert nvlink_matrix(inv)[0] == [0, 2, 2, 2, 0, 0, 0, 0]
    assert nvlink_matrix(inv)[7] == [0, 0, 0, 0, 2, 2, 2, 0]
    node = build_model(inv)
    assert node.islands() == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert [g.numa_node for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert node.gpus[0].cuda_driver_version == (12, 4) and node.gpus[0].nvlink_peers == (1, 2, 3)
    text = tree(inv)
    assert (
        "GPU 4 NVIDIA H100 80GB HBM3 (79.6 GiB, cc 9.0, 0000:9a:00.0, NVLink peers 5,6,7, island 1)"
        in text
    )
    assert text.index("NUMANode 1") < text.index("GPU 4")


def test_pcie_cards_report_nvlink_not_supported(tmp_path, monkeypatch):
    sys_, proc = fakes.gpu_box(tmp_path)
    fakes.FakeNvml(monkeypatch, count=2, islands=None, name="NVIDIA L4")
    inv = read_gpus(Roots(sys_, proc))
    assert [(g.nvlink_up, g.nvlink_links, g.nvlink_error, g.mig_mode) for g in inv.gpus] == [
        (0, {}, "NVMLError_NotSupported", None)
    ] * 2
    assert inv.islands() == {0: 0, 1: 1}


def test_config_errors_point_at_file_line_col():
    with pytest.raises(ConfigError, match=r"^a.yaml:2:15: reservedCpus: expected a cpu list"):
        parse_config("labels: {}\nreservedCpus: zero\n", "a.yaml")
    with pytest.raises(ConfigError, match=r"^a.yaml:2:1: invalid YAML"):
        parse_config("labels: {rack: [\n", "a.yaml")


def test_cli_on_recorded_tree(server, no_nvml, tmp_path):
    from xhagent.inventory.cli import inventory

    cfg = tmp_path / "agent.yaml"
    cfg.write_text("labels: {rack: r9}\nreservedCpus: [0, 8]\n")
    args = [
        "--sysfs-root",
        str(server.sys),
        "--procfs-root",
        str(server.proc),
        "--config",
        str(cfg),
    ]
    runner = CliRunner()
    text = runner.invoke(inventory, args)
    assert text.exit_code == 0, text.output
    assert (
        "Core 0 L2 2 MiB: PU 0* PU 8*" in text.output
        and "NVML unavailable: no NVIDIA driver" in text.output
    )
    gpu = json.loads(runner.invoke(inventory, [*args, "--json", "--section", "gpu"]).output)
    assert gpu == {
        "gpu": {
            "nvml": {
                "available": False,
                "cuda_driver_version": None,
                "driver_version": None,
                "reason": f"no NVIDIA driver: {server.sys}/bus/pci/drivers/nvidia absent",
            },
            "gpus": [],
            "nvlink_matrix": [],
        }
    }
    assert set(as_dict(discover_node(server, AgentConfig("n")))) == {
        "cpu",
        "numa",
        "memory",
        "pci",
        "gpu",
        "accel",
        "block",
        "labels",
    }
    out = runner.invoke(inventory, [*args, "--model", "--json"])
    node = model.Node.from_dict(json.loads(out.output))
    assert (
        node.labels.rack == "r9"
        and node.reserved_cpus == (0, 8)
        and len(node.allocatable_cpus) == 14
    )
    cfg.write_text("labels: [r9]\n")
    bad = runner.invoke(inventory, args)
    assert bad.exit_code == 2 and f"{cfg}:1:9: labels: expected a mapping" in bad.output


def test_pci_ids_read_in_hex_in_text_and_json(server, no_nvml):
    from xhagent.inventory.cli import inventory

    args = ["--sysfs-root", str(server.sys), "--procfs-root", str(server.proc), "--section", "pci"]
    runner = CliRunner()
    nvme = json.loads(runner.invoke(inventory, [*args, "--json"]).output)["pci"][1]
    assert (nvme["vendor_id"], nvme["device_id"], nvme["class_id"]) == (0x144D, 0xA824, 0x010802)
    assert (nvme["pci_id"], nvme["class_code"]) == ("144d:a824", "010802")
    text = runner.invoke(inventory, args).output
    assert (
        "class_id: '0x010802', vendor_id: '0x144d', device_id: '0xa824'" in text
        and "5283" not in text
    )
