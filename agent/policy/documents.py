"""Reading any input of the scheduling core: policies, tasks (by `kind`) and node models.

A file whose first document has no `kind` is a node model (`nodes: [...]` or one node)
and is read by the inventory's loader; its errors are FILE:LINE:COL too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from ..inventory import model as inventory
from ..spec import SpecError, load_file
from .policy import Policy, parse_policy
from .task import Task, parse_task

KINDS = {"SchedulingPolicy": parse_policy, "Task": parse_task}
Item = Union[Policy, Task, inventory.Node]


class InputError(ValueError):
    """Any located input error (SpecError or the inventory's ModelError), as one message."""


@dataclass
class Inputs:
    policies: list[Policy] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    nodes: list[inventory.Node] = field(default_factory=list)

    def add(self, item: Item) -> None:
        {Policy: self.policies, Task: self.tasks, inventory.Node: self.nodes}[type(item)].append(item)


def load(path: str | Path) -> list[Item]:
    """Every document of one file, parsed and validated; InputError on the first problem."""
    try:
        docs = load_file(path)
        if docs and not (isinstance(docs[0].value, dict) and "kind" in docs[0].value):
            return list(inventory.load(path))
        out: list[Item] = []
        for doc in docs:
            doc.root.mapping()
            kind = doc.root["kind"].str(list(KINDS))
            out.append(KINDS[kind](doc))
        return out
    except (SpecError, inventory.ModelError) as exc:
        raise InputError(str(exc)) from None


def load_all(paths) -> Inputs:
    inputs = Inputs()
    for path in paths:
        for item in load(path):
            inputs.add(item)
    return inputs


def policy_files(directory: str | Path) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"{d}: not a directory")
    return sorted(p for p in d.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
