"""The resource model: round trips, defaults, islands, and errors with FILE:LINE:COL."""

import textwrap

import pytest

from xhagent import node_model as m

DOC = textwrap.dedent(m.__doc__.split("::", 1)[1].split("Only `name`")[0])


def test_docstring_example_loads_and_round_trips():
    (node,) = m.load_nodes_text(DOC, "doc.yaml")
    assert node.name == "gpu-07"
    assert node.labels.rack == "r12" and node.labels.extra == {"pool": "training"}
    assert node.allocatable_cpus == (1, 64, 65)
    assert [c.whole for _, _, c in node.cores()] == [
        False,
        True,
    ]  # core 0 lost sibling 0 to the system
    assert node.numa[0].memory_total == 256 << 30
    assert node.gpus[0].cuda_driver_version == (12, 4)
    assert node.islands() == {0: (0, 1)}
    assert node.io[0].io_class == "polled" and node.io[0].size_bytes == 3_840_000_000_000
    assert [(t.index, t.model, t.device_nodes) for t in node.tpus] == [
        (0, "TPU v4", ("/dev/accel0",))
    ]
    assert m.load_nodes_text(m.dumps_yaml(node)) == [node]
    assert m.load_nodes_text(m.dumps_json([node, m.Node("other")])) == [node, m.Node("other")]
    assert m.Node.from_dict(node.to_dict()) == node


def test_islands_are_computed_from_peers():
    def gpu(i, peers):
        return m.Gpu(
            i,
            f"GPU-{i}",
            "A100",
            m.Bytes(40 << 30),
            m.Bytes(40 << 30),
            m.Version(12, 2),
            m.Version(8, 0),
            nvlink_peers=peers,
        )

    node = m.Node("n", gpus=(gpu(0, (1,)), gpu(1, (0,)), gpu(2, ()), gpu(3, ())))
    assert [g.island for g in node.gpus] == [0, 0, 1, 2]
    assert node.islands() == {0: (0, 1), 1: (2,), 2: (3,)}


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "name: x\n"
            "numa: [{id: 0, l3: [{id: 0, cores: [{id: 0, package: 0, cpus: [1, 'a']}]}]}]\n",
            "f.yaml:2:67: numa.0.l3.0.cores.0.cpus.1: expected an integer, got a string",
        ),
        (
            "name: x\nfoo: 1\n",
            "f.yaml:2:6: foo: unknown key; expected one of name, labels, reservedCpus",
        ),
        ("name: [x\n", "f.yaml:2:1: invalid YAML: expected ',' or ']'"),
        ("nodes: [{name: a}, {name: a}]", "f.yaml:1:8: nodes: duplicate node name a"),
        (
            "name: x\nreservedCpus: [0]\n"
            "numa: [{id: 0, l3: [{id: 0, cores: [{id: 0, package: 0, cpus: [0]}]}]}]",
            "f.yaml:2:15: reservedCpus: cpus [0] are both reserved and allocatable",
        ),
        ("", "f.yaml:1:1: empty document"),
        ("name: x\nio: [{name: a, dev: '8'}]", "f.yaml:2:21: io.0.dev: '8' is not MAJ:MIN"),
        ("name: x\nmemory: {total: 12 parsecs}", "f.yaml:2:17: memory.total: expected a size"),
        (
            "name: x\ngpus:\n- {index: 0, uuid: u, name: n, memoryTotal: 1GiB, memoryFree: 1GiB,\n"
            "   cudaDriverVersion: twelve, computeCapability: '9.0'}",
            "f.yaml:4:23: gpus.0.cudaDriverVersion: expected a version MAJOR.MINOR",
        ),
        (
            "name: x\ngpus:\n- {index: 0, uuid: u, name: n, memoryTotal: 1GiB, memoryFree: 1GiB,\n"
            "   cudaDriverVersion: '12.4', computeCapability: '9.0', nvlinkPeers: [3]}",
            "f.yaml:4:70: gpus.0.nvlinkPeers: no GPU with index [3]",
        ),
        ("version: 2\nnodes: []", "f.yaml:1:10: version: unsupported version 2"),
        (
            "name: x\naccelerators: [{index: 0, kind: fpga, name: a}]",
            "f.yaml:2:33: accelerators.0.kind: 'fpga' is not one of tpu, accelerator",
        ),
        (
            "name: x\naccelerators:\n"
            "- {index: 0, kind: tpu, name: a}\n- {index: 0, kind: tpu, name: b}",
            "f.yaml:3:1: accelerators: duplicate accelerator tpu 0",
        ),
        (
            "name: x\nnuma: [{id: 0}]\naccelerators: [{index: 0, kind: tpu, name: a, numaNode: 1}]",
            "accelerators.0.numaNode: no NUMA node 1",
        ),
        (
            "name: x\n"
            "numa: [{id: 0, l3: [{id: 0, cores: "
            "[{id: 0, package: 0, cpus: [1], siblings: [0]}]}]}]",
            "numa.0.l3.0.cores.0.cpus: cpus [1] are not among siblings [0]",
        ),
    ],
)
def test_bad_models_name_file_line_col_and_path(text, message):
    with pytest.raises(m.ModelError) as info:
        m.load_nodes_text(text, "f.yaml")
    assert message in str(info.value)


def test_load_missing_file(tmp_path):
    with pytest.raises(m.ModelError, match="nope.yaml:1:1: cannot read: No such file or directory"):
        m.load_nodes(tmp_path / "nope.yaml")


def test_sizes_and_versions():
    assert m.parse_bytes("512MiB") == 512 << 20 and m.parse_bytes("1.5 GB") == 1_500_000_000
    assert m.parse_version([12, 2]) == m.Version(12, 2) and str(m.parse_version("11.8")) == "11.8"
    with pytest.raises(ValueError):
        m.parse_bytes(True)


@pytest.mark.parametrize(
    "text, lines",
    [
        # CPU ids out of the kernel's range (0..8191) were placed
        (
            "name: x\nreservedCpus: [-2]\n"
            "numa: [{id: 0, l3: [{id: 0, cores: [{id: 0, package: 0, cpus: [100000]}]}]}]\n",
            [
                "f.yaml:2:16: reservedCpus.0: -2 is out of range 0..8191",
                "f.yaml:3:64: numa.0.l3.0.cores.0.cpus.0: 100000 is out of range 0..8191",
            ],
        ),
        (
            "name: x\n"
            "numa: [{id: 0, l3: [{id: 0, cores: "
            "[{id: 0, package: 0, cpus: [1000000000000000000000000000000]}]}]}]\n",
            ["f.yaml:2:64: 1000000000000000000000000000000 is too large (at most 64 bits)"],
        ),
        # every error at once, in file order; a 400-digit size; no Python repr of a date
        (
            "nodes:\n- name: x\n  memory: {total: " + "9" * 400 + "GiB}\n  foo: 1\n"
            "- name: y\n"
            "  gpus: [{index: -1, uuid: u, name: n, memoryTotal: 2024-01-01, memoryFree: 1,\n"
            "          cudaDriverVersion: '12.4', computeCapability: '9.0'}]\n",
            [
                "f.yaml:3:19: nodes.0.memory.total: size 99999999999999999999... "
                "(403 characters) is larger than 8 EiB",
                "f.yaml:4:8: nodes.0.foo: unknown key; "
                "expected one of name, labels, reservedCpus, numa, memory, gpus, io, accelerators",
                "f.yaml:6:18: nodes.1.gpus.0.index: -1 is out of range 0..9223372036854775807",
                "f.yaml:6:53: nodes.1.gpus.0.memoryTotal: "
                "expected a size such as 4096, 512MiB or 64GiB, got a date",
            ],
        ),
    ],
)
def test_every_model_error_at_once_located(text, lines):
    with pytest.raises(m.ModelError) as info:
        m.load_nodes_text(text, "f.yaml")
    assert str(info.value).splitlines() == lines
