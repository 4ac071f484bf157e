"""Node models for simulation, in either of two formats.

The inventory's node model (`xhagent.node_model`, e.g. configs/examples/nodes.yaml):
every allocatable CPU and every GPU becomes a slot on its NUMA node.

Or, for quick what-ifs, a plain count per node:

    nodes:
      - {name: node-01, cpus: 8, gpus: 2, numaNodes: 2}
      - {name: node-02, cpus: 4}
      - {name: node-03, cpus: 8, gpus: 1, gpuMemory: 16Gi, gpuShares: 8}

`gpuMemory` (per GPU) turns on the simulator's GPU memory model; `gpuShares` is how many
jobs one GPU runs at once (default 1), sharing that memory.

A file whose node entries have a `cpus` count is read as the second kind.
"""

from __future__ import annotations

from pathlib import Path

from .. import node_model as inventory
from ..quantity import parse_size
from ..spec import Cursor, SpecError, load_file, load_text
from .slots import NodeSpec

NODE_FIELDS = {"name", "cpus", "gpus", "tpus", "numaNodes", "gpuMemory", "gpuShares"}


def parse(root: Cursor) -> list[NodeSpec]:
    """The plain format; SpecErrors with every error of the document, in file order."""
    doc = root.doc
    root.mapping()
    with doc.collecting():
        root.mapping({"apiVersion", "kind", "metadata", "nodes"}, required={"nodes"})
    nodes, seen = [], set()
    for c in root["nodes"].seq(default=[]):
        before = doc.errors.total
        with doc.collecting():
            c.mapping(NODE_FIELDS, required={"name"})
        fields = {}
        for key, name, read in (
            ("name", "name", lambda f: f.str()),
            ("cpus", "cpus", lambda f: f.int(0, 4096, default=1)),
            ("gpus", "gpus", lambda f: f.int(0, 64, default=0)),
            ("tpus", "tpus", lambda f: f.int(0, 64, default=0)),
            ("numa_nodes", "numaNodes", lambda f: f.int(1, 64, default=1)),
            ("gpu_memory", "gpuMemory", lambda f: f.parse(parse_size, "size", default=0)),
            ("gpu_shares", "gpuShares", lambda f: f.int(1, 64, default=1)),
        ):
            with doc.collecting():
                fields[key] = read(c[name])
        if doc.errors.total != before:
            continue
        node = NodeSpec(**fields)
        with doc.collecting():
            if node.name in seen:
                raise c["name"].error(f"duplicate node {node.name!r}")
            if node.cpus + node.gpus + node.tpus == 0:
                raise c.error(f"node {node.name} has no cpus, gpus or tpus")
            seen.add(node.name)
            nodes.append(node)
    doc.errors.raise_if_any()
    if not nodes:
        raise root["nodes"].error("nodes: give at least one node")
    return nodes


def from_inventory(node: inventory.Node) -> NodeSpec:
    numa_of_cpu = {cpu: numa.id for numa in node.numa for cpu in numa.cpus}
    cpu_numa = tuple(numa_of_cpu[c] for c in node.allocatable_cpus)
    gpu_numa = tuple(g.numa_node or 0 for g in node.gpus)
    tpu_numa = tuple(t.numa_node or 0 for t in node.tpus)
    return NodeSpec(
        node.name,
        cpus=len(cpu_numa),
        gpus=len(gpu_numa),
        tpus=len(tpu_numa),
        numa_nodes=max(1, len(node.numa)),
        cpu_numa=cpu_numa,
        gpu_numa=gpu_numa,
        tpu_numa=tpu_numa,
        model=node,
    )


def as_model(spec: NodeSpec, slots) -> inventory.Node:
    """The inventory node that placement checks hard constraints on: `spec.model` when the
    nodes came from the inventory, else one made from the counts and `slots` (the
    simulator's, for each device's NUMA node): no labels, GPUs of unknown CUDA version
    (0.0, so a policy's minCudaVersion never admits one) and `gpuMemory` each, TPU chips."""
    if spec.model is not None:
        return spec.model
    numa = {(s.device, s.index): s.numa for s in slots if s.node == spec.name}
    return inventory.Node.from_dict(
        {
            "name": spec.name,
            "numa": [{"id": k} for k in range(spec.numa_nodes)],
            "gpus": [
                {
                    "index": i,
                    "uuid": f"SIM-{spec.name}-{i}",
                    "name": "simulated GPU",
                    "memoryTotal": spec.gpu_memory,
                    "memoryFree": spec.gpu_memory,
                    "cudaDriverVersion": "0.0",
                    "computeCapability": "0.0",
                    "numaNode": numa[("gpu", i)],
                }
                for i in range(spec.gpus)
            ],
            "accelerators": [
                {"index": i, "kind": "tpu", "name": f"tpu{i}", "numaNode": numa[("tpu", i)]}
                for i in range(spec.tpus)
            ],
        }
    )


def is_plain_format(docs) -> bool:
    """Whether a file's documents are the plain format (node entries with a `cpus` count),
    not the inventory's node model: `load_node_specs` and the policy inputs' file kinds
    (xhagent.policy.documents) both go by it."""
    value = docs[0].value if docs else None
    entries = value.get("nodes") if isinstance(value, dict) else None
    return isinstance(entries, list) and any(isinstance(n, dict) and "cpus" in n for n in entries)


def load_node_specs(path: str | Path) -> list[NodeSpec]:
    """Nodes from either format. Errors read FILE:LINE:COL: message, every error of the file
    at once, as SpecError (plain format) or the inventory's ModelError."""
    docs = load_file(path)
    if not docs:
        raise SpecError(str(path), 1, 1, "empty file: expected `nodes: [...]`")
    if is_plain_format(docs):
        return parse(docs[0].root)
    return [from_inventory(n) for n in inventory.from_documents(docs, str(path))]


def load_node_specs_text(text: str, file: str = "<string>") -> list[NodeSpec]:
    docs = load_text(text, file)
    if not docs:
        raise SpecError(file, 1, 1, "empty file: expected `nodes: [...]`")
    return parse(docs[0].root)
