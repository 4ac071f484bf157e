"""Statistics of groups (cpu.stat, io.stat, memory.*, pressure), read in one batch.

The io engine's `Sampler` (files held open, all re-read in one C call) does the reading when
the installed agent has it; otherwise each file is read with a plain read. `StatsSampler`
keeps a set of groups' files open for a periodic reader (metrics); `read_stats` is one
sample of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import registry
from .group import Cgroup


def _sampler_class():
    """The io engine's Sampler, loaded at the first read (it brings io_uring and the cffi
    binding along: a process that never reads stats does not pay for them); None where the
    engine is not built (it is optional for the cgroup library)."""
    try:
        from ..io import Sampler
    except ImportError:
        return None
    return Sampler


def _plain(paths: list[Path]) -> list[bytes | None]:
    out: list[bytes | None] = []
    for p in paths:
        try:
            out.append(p.read_bytes())
        except OSError:
            out.append(None)
    return out


class _PlainReader:
    """What StatsSampler reads through where the io engine is missing or refused."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.reads = 0

    def read(self) -> list[bytes | None]:
        out = _plain(self.paths)
        self.reads += sum(data is not None for data in out)  # a file absent here is no read
        return out

    def counts(self) -> dict[str, int]:
        return {"plain": self.reads}

    def close(self) -> None:
        pass


class _SampledReader:
    def __init__(self, sampler_class, paths: list[Path]):
        self.sampler = sampler_class(paths)
        self._order = [self.sampler.index(p) for p in paths]  # a path asked twice is held once

    def read(self) -> list[bytes | None]:
        snap = self.sampler.sample_packed()
        return [snap[i] for i in self._order]

    def counts(self) -> dict[str, int]:
        stats = self.sampler.stats
        return {"io_uring": stats["uring"], "pread": stats["pread"]}

    def close(self) -> None:
        self.sampler.close()


def _reader(paths: list[Path]):
    sampler_class = _sampler_class()
    if sampler_class is not None:
        try:
            return _SampledReader(sampler_class, paths)
        except (OSError, RuntimeError):
            pass  # the engine refused (seccomp, no cffi module): plain reads below
    return _PlainReader(paths)


def read_many(paths: list[Path]) -> list[bytes | None]:
    """The contents of each path (None where it cannot be read)."""
    if not paths:
        return []
    reader = _reader(paths)
    try:
        return reader.read()
    finally:
        reader.close()


class StatsSampler:
    """The statistics files of `groups`, held open between reads: `read()` costs one pass
    over files already open. A group removed meanwhile has no statistics (its files read as
    gone, never as the last values); one re-created under the same name is read afresh."""

    def __init__(
        self, groups: list[Cgroup], files: tuple[registry.CgroupFile, ...] = registry.STATS
    ):
        self.groups = list(groups)
        self._wanted = [(i, f) for i in range(len(self.groups)) for f in files]
        self._reader = _reader([self.groups[i].path / f.name for i, f in self._wanted])

    def read(self) -> list[dict[str, Any]]:
        """For each group, {file name: parsed value} of the statistics files it has."""
        raw = self._reader.read()
        out: list[dict[str, Any]] = [{} for _ in self.groups]
        for (i, f), data in zip(self._wanted, raw, strict=True):  # one result per path
            if data is not None:
                out[i][f.name] = f.parse(data.decode())
        return out

    def reads(self) -> dict[str, int]:
        """Files read so far, by how: `io_uring` (registered files), `pread` (files io_uring
        would hand to its worker threads: read by a C loop instead), `plain` (the io engine
        missing or refused: open, read, close in Python)."""
        return self._reader.counts()

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> StatsSampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_stats(
    groups: list[Cgroup], files: tuple[registry.CgroupFile, ...] = registry.STATS
) -> list[dict[str, Any]]:
    """For each group, {file name: parsed value} of the statistics files it has."""
    with StatsSampler(groups, files) as sampler:
        return sampler.read()
