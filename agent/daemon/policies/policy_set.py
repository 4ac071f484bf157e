"""The policies in force: files of the policy directory, and those applied through the API.

Every change takes the same steps in the same order, whatever brought it (the directory's
watch and SIGHUP: `reload`; ApplyPolicy: `apply`; RemovePolicy: `remove`): the text is
validated whole (as `xhagent policy validate` does), names are checked against the other
sources (`_check_names`), a CgroupPolicy is put into the kernel (planned against the node's
real cgroup mode and applied whole or not at all: `_enact`), the version is recorded, one
event says what happened, and the scheduler loop is woken (`on_change`).

In force means in the kernel: a CgroupPolicy the node cannot enforce is refused, like a
file with an error, and changes nothing (a file's previous version, if any, stays in force;
through the API the call fails with each setting and why). Policies applied through the API
are kept in the store (they have no other home) with a version per apply; a name defined by
a file cannot be applied or removed through the API (the file would bring it back).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ...policy.classes import class_table
from ...spec import SpecError
from ..store import CorruptPolicy, PolicyRecord, Store
from .enact import Enacted
from .files import read_policy_file
from .sources import CONFIGMAP_SWAP, KINDS, SUFFIXES, Loaded, PolicyError, parse_source

log = logging.getLogger("xhagent")


class PolicyNotApplied(PolicyError):
    """A CgroupPolicy the node cannot enforce: nothing was recorded and nothing changed."""

    def __init__(self, enacted: Enacted):
        super().__init__(enacted.report(), invalid=False)
        self.enacted = enacted


class PolicySet:
    def __init__(
        self,
        directory: Path | None,
        store: Store,
        clock: Callable[[], int],
        report: Callable[[str, str], None],
        enact: Callable[[object], Enacted] | None = None,
    ):
        self.directory = directory
        self.store = store
        self.clock = clock
        self.report = report  # (event kind, message), for the log and the event stream
        # puts a CgroupPolicy into the kernel; None: nowhere to put it (it is in force as it is)
        self.enact = enact
        self.on_change: Callable[[], None] = lambda: None  # the scheduler loop's wake-up
        self.files: dict[str, tuple[str, list[Loaded]]] = {}  # file name -> (text, in force)
        self.applied: dict[tuple[str, str], Loaded] = {}
        # file name -> why it was last refused: a refusal is said once, until it changes
        self._refused: dict[str, str] = {}
        for rec in store.active_policies():
            if (item := self._stored(rec)) is not None:
                self.applied[(rec.kind, rec.name)] = item

    def _stored(self, rec: PolicyRecord | CorruptPolicy) -> Loaded | None:
        """An applied policy as the store keeps it. Its text is its own document (or, as an
        older agent stored it, the whole file it came in: only its own policy is taken from
        it, so that a sibling removed since stays removed). A row or a text that no longer
        reads is said and not in force; the agent starts all the same."""
        if isinstance(rec, CorruptPolicy):
            self.report("PolicyRejected", f"{rec}; applied through the API, it is not in force")
            return None
        try:
            loaded = parse_source(rec.source, rec.file)
            found = [i for i in loaded if (i.kind, i.name) == (rec.kind, rec.name)]
        except PolicyError as exc:
            found, why = [], str(exc)
        else:
            why = "the text kept for it defines no such policy"
        if len(found) != 1:
            self.report(
                "PolicyRejected",
                f"{rec.kind} {rec.name} version {rec.version}, applied through the API, is not "
                f"in force: {why}",
            )
            return None
        item = found[0]
        return Loaded(rec.kind, rec.name, item.value, rec.file, rec.version, rec.applied_ns)

    # -- the directory ------------------------------------------------------------------------
    def reload(
        self, names: set[str | None] | None = None, between: Callable[[], None] = lambda: None
    ) -> bool:
        """Re-read the directory (`names` None or holding None: every file); True when what
        is in force changed. A file whose text is unchanged is no change. `between()` is
        called before each file (what it raises ends the reload there: each file read is
        whole on its own)."""
        if self.directory is None or not self.directory.is_dir():
            return False
        if names is None or None in names or CONFIGMAP_SWAP in names:
            present = {p.name for p in self.directory.iterdir() if p.suffix in SUFFIXES}
            names = present | set(self.files)
        changed = False
        for name in sorted(n for n in names if n and Path(n).suffix in SUFFIXES):
            between()
            changed |= self._reload_file(name)
        if changed:
            self.on_change()
        return changed

    def _reload_file(self, name: str) -> bool:
        path = self.directory / name
        kept = "the previous version stays in force" if name in self.files else "ignored"
        try:
            text = read_policy_file(self.directory, name)  # never waits: see files.py
            if text is None:
                self._refused.pop(name, None)
                if self.files.pop(name, None) is None:
                    return False
                self.report("PolicyRemoved", f"{path}: removed; its policies no longer apply")
                return True
            if name in self.files and self.files[name][0] == text:
                return False
            loaded = parse_source(text, str(path))
            self._check_names(loaded, origin=name)
            enacted = self._enact(loaded)
        except (SpecError, PolicyError) as exc:
            why = f"{_one_line(str(exc))} ({kept})"
            if self._refused.get(name) != why:  # the same refusal again is no news
                self._refused[name] = why
                self.report("PolicyRejected", why)
            return False
        self._refused.pop(name, None)
        self.files[name] = (text, loaded)
        self.report("PolicyLoaded", f"{path}: {_described(loaded, enacted)}")
        return True

    # -- the API -----------------------------------------------------------------------------
    def apply(self, source: str, file_name: str) -> tuple[list[dict], Enacted | None]:
        """Put `source`'s policies in force: their infos as recorded, and what the kernel
        was given of its CgroupPolicy. PolicyError (PolicyNotApplied for a CgroupPolicy the
        node cannot enforce) when nothing changed."""
        loaded = parse_source(source, file_name)
        self._check_names(loaded, origin=None)
        enacted = self._enact(loaded)
        out = []
        with self.store.atomic():  # the versions and their one event, or nothing
            for item in loaded:
                version = self.store.put_policy(item.kind, item.name, item.text, file_name)
                kept = Loaded(item.kind, item.name, item.value, file_name, version, self.clock())
                out.append(kept)
            versions = ", ".join(f"{i.kind} {i.name} version {i.version}" for i in out)
            self.store.add_event("PolicyApplied", f"{versions} from {file_name}{_what(enacted)}")
        for item in out:
            self.applied[(item.kind, item.name)] = item
        log.info("PolicyApplied: %s", versions)
        self.on_change()
        return [i.info() for i in out], enacted

    def remove(self, kind: str, name: str) -> dict:
        kinds = [kind] if kind else list(KINDS)
        for k in kinds:
            if holder := self._file_holding(k, name):
                raise PolicyError(f"{k} {name} is defined by {holder}: remove the file", False)
            item = self.applied.get((k, name))
            if item is None:
                continue
            with self.store.atomic():
                version = self.store.remove_policy(k, name)
                self.store.add_event("PolicyRemoved", f"{k} {name} version {version}")
            del self.applied[(k, name)]
            log.info("PolicyRemoved: %s %s", k, name)
            self.on_change()
            return item.info()
        raise KeyError(name)

    # -- the kernel ------------------------------------------------------------------------------
    def _enact(self, loaded: list[Loaded]) -> Enacted | None:
        """Put the CgroupPolicy among `loaded` (a file holds one at most) into the kernel;
        PolicyNotApplied when the node cannot enforce it."""
        for item in loaded:
            if item.kind == "CgroupPolicy" and self.enact is not None:
                enacted = self.enact(item.value)
                if not enacted.ok:
                    raise PolicyNotApplied(enacted)
                return enacted
        return None

    def reconcile(self) -> None:
        """At start, after the files were loaded (each one's CgroupPolicy enacted then): every
        CgroupPolicy applied through the API put into the kernel again (what drifted while no
        agent ran is set back); one that no longer can be is said, and stays recorded."""
        if self.enact is None:
            return
        for item in self.applied.values():
            if item.kind != "CgroupPolicy":
                continue
            enacted = self.enact(item.value)
            kind = "CgroupPolicyApplied" if enacted.ok else "CgroupPolicyNotApplied"
            self.report(kind, enacted.summary())

    # -- what is in force ----------------------------------------------------------------------
    def all(self) -> list[Loaded]:
        files = [item for _, items in self.files.values() for item in items]
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
        for file, (_, items) in self.files.items():
            if any(i.kind == kind and i.name == name for i in items):
                return str(self.directory / file) if self.directory else file
        return None

    def _check_names(self, loaded: list[Loaded], origin: str | None) -> None:
        """One definition per (kind, name): across files, and between files and the API."""
        for item in loaded:
            for file, (_, items) in self.files.items():
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


def _described(loaded: list[Loaded], enacted: Enacted | None) -> str:
    return ", ".join(f"{i.kind} {i.name}" for i in loaded) + _what(enacted)


def _one_line(text: str) -> str:
    """An error of several lines (each FILE:LINE:COL, or a heading and its items) as the one
    line an event is: the lines joined by "; ", a heading's colon kept."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(lines).replace(":; ", ": ")


def _what(enacted: Enacted | None) -> str:
    return f" ({len(enacted.changes)} cgroup changes)" if enacted is not None else ""
