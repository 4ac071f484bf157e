"""Reading any input file of the project: which kind it is, and its validated contents.

A document's `kind` names it: SchedulingPolicy and Task are read here, CgroupPolicy and
Workload by their own loaders. A file without `kind` is a node model (`nodes: [...]`, or
one node with a `name`: the inventory's format, or the simulator's plain `cpus: N` list)
or the agent config (`nodeName`, `labels`, `reservedCpus`). The file is read once, through
`xhagent.spec` (bounded, UTF-8, no aliases), so every loader gets those protections and a
FIFO can be validated too. Every error of a file is reported at once, each FILE:LINE:COL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import node_model as inventory
from ..spec import Document, ErrorList, SpecError, load_text, read_text
from .policy import SchedulingPolicy, parse_policy
from .task import Task, parse_task

KINDS = {"SchedulingPolicy": parse_policy, "Task": parse_task}
OTHER_KINDS = ("CgroupPolicy", "Workload")  # read by their own loaders
CONFIG_KEYS = {"nodeName", "labels", "reservedCpus", "stateDir", "socket", "policiesDir"}
EXPECTED = (
    "a SchedulingPolicy, Task, CgroupPolicy or Workload document, a node model "
    "(nodes: [...] or one node with a name) or an agent config (nodeName, labels, reservedCpus)"
)
Item = SchedulingPolicy | Task | inventory.Node


class DocumentError(ValueError):
    """Any input error (SpecError or the inventory's ModelError), as one message; `errors`
    keeps the located ones of a SpecError for `--json`."""

    def __init__(self, message: str, errors: list[SpecError] | None = None):
        super().__init__(message)
        self.errors = errors or []

    def located(self) -> list[dict[str, Any]]:
        return [
            {"file": e.file, "line": e.line, "col": e.col, "message": e.message}
            for e in self.errors
        ]


@dataclass
class Inputs:
    policies: list[SchedulingPolicy] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    nodes: list[inventory.Node] = field(default_factory=list)

    def add(self, item: Item) -> None:
        {SchedulingPolicy: self.policies, Task: self.tasks, inventory.Node: self.nodes}[
            type(item)
        ].append(item)


@dataclass
class File:
    """One input file, read and split into documents, with what kind of file it is."""

    path: str
    text: str
    docs: list[Document]
    kind: str  # "scheduling", a name of OTHER_KINDS, "nodes", "plain-nodes" or "config"


def read(path: str | Path) -> File:
    """The file's documents and kind; DocumentError when it is none of the kinds."""
    name = str(path)
    try:
        text = read_text(name)
        docs = [
            d for d in load_text(text, name) if d.value is not None
        ]  # `---` with nothing after it
        if not docs:
            raise SpecError(name, 1, 1, f"empty file: expected {EXPECTED}")
        return File(name, text, docs, _kind_of(docs))
    except SpecError as exc:
        raise DocumentError(str(exc), _located(exc)) from None


def _kind_of(docs: list[Document]) -> str:
    first = docs[0]
    if not isinstance(first.value, dict):
        raise first.error((), f"expected a mapping: {EXPECTED}")
    if "kind" not in first.value:
        return _kindless(first)
    errors, kinds = ErrorList(), []
    for doc in docs:
        with errors.collecting():
            kinds.append(doc.root.mapping(required={"kind"})["kind"].str([*KINDS, *OTHER_KINDS]))
    errors.raise_if_any()
    other = [k for k in kinds if k in OTHER_KINDS]
    if other and len(set(kinds)) > 1:
        at = next(d for d, k in zip(docs, kinds, strict=True) if k != other[0])
        raise at.root["kind"].error(f"kind: a {other[0]} file holds only {other[0]} documents")
    return other[0] if other else "scheduling"


def _kindless(doc: Document) -> str:
    keys = set(doc.value)
    if "nodes" in keys:
        from ..sched.nodes import is_plain_format  # the simulator's own test of its format

        return "plain-nodes" if is_plain_format([doc]) else "nodes"
    if "name" in keys:
        return "nodes"
    if keys & CONFIG_KEYS:
        return "config"
    raise doc.error((), f"no kind: expected {EXPECTED}")


def _parse_scheduling(f: File) -> list[Item]:
    """Every SchedulingPolicy and Task of the file; errors of all documents together."""
    errors, out = ErrorList(), []
    for doc in f.docs:
        with errors.collecting():
            out.append(KINDS[doc.value["kind"]](doc))
    errors.raise_if_any()
    return out


def load_items(path: str | Path) -> list[Item]:
    """What the scheduling core reads from one file: policies, tasks and (inventory-format)
    nodes. Files of other kinds give nothing; DocumentError has every problem of the file."""
    f = read(path)
    return _guarded(
        f,
        lambda: (
            _parse_scheduling(f)
            if f.kind == "scheduling"
            else inventory.load_nodes_text(f.text, f.path)
            if f.kind == "nodes"
            else []
        ),
    )


def load_any(path: str | Path, sys_root: Path = Path("/sys")) -> list[Any]:
    """Every kind the project reads, each by its own loader (for `policy validate`).
    A CgroupPolicy's devices are resolved on this node (under `sys_root`), as `cgroup plan` does."""
    f = read(path)

    def parse() -> list[Any]:
        if f.kind == "scheduling":
            return _parse_scheduling(f)
        if f.kind == "CgroupPolicy":
            from ..cgroups.policy import load_policy_text

            return [load_policy_text(f.text, f.path, sys_root)]
        if f.kind == "Workload":
            from ..sched.workload import load_workload_text

            return [load_workload_text(f.text, f.path)]
        if f.kind == "plain-nodes":
            from ..sched.nodes import load_node_specs_text

            return list(load_node_specs_text(f.text, f.path))
        if f.kind == "config":
            from ..config import parse_config

            return [parse_config(f.text, f.path)]
        return list(inventory.load_nodes_text(f.text, f.path))

    return _guarded(f, parse)


def _guarded(f: File, parse) -> list[Any]:
    try:
        return parse()
    except SpecError as exc:
        raise DocumentError(str(exc), _located(exc)) from None
    except inventory.ModelError as exc:
        raise DocumentError(str(exc)) from None
    except ValueError as exc:  # a loader's unlocated error: still the user's input, not a crash
        raise DocumentError(f"{f.path}: {exc}") from None


def _located(exc: SpecError) -> list[SpecError]:
    return list(getattr(exc, "errors", [exc]))


def describe_item(item: Any) -> str:
    """`SchedulingPolicy video-inference-strict`, `node node-01`, ... for reports."""
    from ..cgroups.policy import CgroupPolicy  # here: sched imports this package
    from ..config import AgentConfig
    from ..sched.slots import NodeSpec
    from ..sched.workload import Workload

    if isinstance(item, AgentConfig):
        return f"agent config for node {item.node_name}"
    kinds = (
        (SchedulingPolicy, "SchedulingPolicy"),
        (Task, "Task"),
        (CgroupPolicy, "CgroupPolicy"),
        (Workload, "Workload"),
        ((inventory.Node, NodeSpec), "node"),
    )
    kind = next(k for cls, k in kinds if isinstance(item, cls))
    return f"{kind} {item.name or '(unnamed)'}"


def load_all(paths) -> Inputs:
    inputs = Inputs()
    for path in paths:
        for item in load_items(path):
            inputs.add(item)
    return inputs


def policy_files(directory: str | Path) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        raise DocumentError(f"{d}: not a directory")
    return sorted(p for p in d.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
