"""The policies in force: files of the policy directory, and those applied through the API.

A file is read whole and validated as `xhagent policy validate` does; a file with any error
changes nothing (its previous version, if any, stays in force) and the error is reported
with FILE:LINE:COL. Policies applied through the API are kept in the store (they have no
other home) with a version per apply; a name defined by a file cannot be applied or removed
through the API (the file would bring it back on the next reload).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...policy.classes import class_table
from ...spec import SpecError, read_text
from ..store import Store
from .sources import CONFIGMAP_SWAP, KINDS, SUFFIXES, Loaded, PolicyError, parse_source


class PolicySet:
    def __init__(
        self,
        directory: Path | None,
        store: Store,
        clock: Callable[[], int],
        report: Callable[[str, str], None],
    ):
        self.directory = directory
        self.store = store
        self.clock = clock
        self.report = report  # (event kind, message), for the log and the event stream
        self.files: dict[str, list[Loaded]] = {}  # file name -> what it holds in force
        self.applied: dict[tuple[str, str], Loaded] = {}
        for rec in store.active_policies():
            loaded = parse_source(rec.source, rec.file)
            for item in loaded:
                self.applied[(item.kind, item.name)] = Loaded(
                    item.kind, item.name, item.value, rec.file, rec.version, rec.applied_ns
                )

    # -- the directory ------------------------------------------------------------------------
    def reload(self, names: set[str | None] | None = None) -> bool:
        """Re-read the directory (`names` None or holding None: every file); True when what
        is in force changed."""
        if self.directory is None or not self.directory.is_dir():
            return False
        if names is None or None in names or CONFIGMAP_SWAP in names:
            present = {p.name for p in self.directory.iterdir() if p.suffix in SUFFIXES}
            names = present | set(self.files)
        changed = False
        for name in sorted(n for n in names if n and Path(n).suffix in SUFFIXES):
            path = self.directory / name
            if not path.exists():
                if self.files.pop(name, None) is not None:
                    self.report("PolicyRemoved", f"{path}: removed; its policies no longer apply")
                    changed = True
                continue
            try:
                loaded = parse_source(read_text(path), str(path))
                self._check_names(loaded, origin=name)
            except (SpecError, PolicyError) as exc:
                kept = "the previous version stays in force" if name in self.files else "ignored"
                self.report("PolicyRejected", f"{exc} ({kept})")
                continue
            self.files[name] = loaded
            self.report("PolicyLoaded", f"{path}: " + ", ".join(_names(loaded)))
            changed = True
        return changed

    # -- the API -----------------------------------------------------------------------------
    def apply(self, source: str, file_name: str) -> list[dict]:
        loaded = parse_source(source, file_name)
        self._check_names(loaded, origin=None)
        out = []
        for item in loaded:
            version = self.store.put_policy(item.kind, item.name, source, file_name)
            kept = Loaded(item.kind, item.name, item.value, file_name, version, self.clock())
            self.applied[(item.kind, item.name)] = kept
            out.append(kept.info())
        self.report("PolicyApplied", ", ".join(_names(loaded)))
        return out

    def remove(self, kind: str, name: str) -> dict:
        kinds = [kind] if kind else list(KINDS)
        for k in kinds:
            if self._file_holding(k, name):
                raise PolicyError(
                    f"{k} {name} is defined by {self._file_holding(k, name)}: remove the file",
                    invalid=False,
                )
            item = self.applied.pop((k, name), None)
            if item is not None:
                self.store.remove_policy(k, name)
                self.report("PolicyRemoved", f"{k} {name}")
                return item.info()
        raise KeyError(name)

    # -- what is in force ----------------------------------------------------------------------
    def all(self) -> list[Loaded]:
        files = [item for items in self.files.values() for item in items]
        return files + list(self.applied.values())

    def list(self) -> list[dict]:
        return [item.info() for item in self.all()]

    def scheduling(self) -> list:
        return [item.value for item in self.all() if item.kind == "SchedulingPolicy"]

    def cgroup(self) -> list:
        return [item.value for item in self.all() if item.kind == "CgroupPolicy"]

    def classes(self) -> dict[str, tuple[int, int]]:
        """Task class -> (cpu.weight, io.weight): built in, then the CgroupPolicies'."""
        return class_table(p.classes for p in self.cgroup())

    def _file_holding(self, kind: str, name: str) -> str | None:
        for file, items in self.files.items():
            if any(i.kind == kind and i.name == name for i in items):
                return str(self.directory / file) if self.directory else file
        return None

    def _check_names(self, loaded: list[Loaded], origin: str | None) -> None:
        """One definition per (kind, name): across files, and between files and the API."""
        for item in loaded:
            for file, items in self.files.items():
                if file != origin and any(
                    i.kind == item.kind and i.name == item.name for i in items
                ):
                    raise PolicyError(
                        f"{item.file_name}: {item.kind} {item.name} is already defined by "
                        f"{self.directory / file if self.directory else file}",
                        invalid=False,
                    )
            if origin is not None and (item.kind, item.name) in self.applied:
                raise PolicyError(
                    f"{item.file_name}: {item.kind} {item.name} was applied through the API: "
                    f"remove it there first (xhagent delete policy {item.name})",
                    invalid=False,
                )


def _names(loaded: list[Loaded]) -> list[str]:
    return [f"{i.kind} {i.name}" for i in loaded]
