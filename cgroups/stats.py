"""Statistics of groups (cpu.stat, io.stat, memory.*, pressure), read in one batch.

The io engine's `read_files` (io_uring, many small reads in one submission) is used when
the installed agent has it; otherwise each file is read with a plain read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import registry as R
from .group import Cgroup


def _batched():
    """The io engine's reader, loaded at the first read (it brings io_uring, the cffi
    binding and asyncio along: a process that never reads stats does not pay for them);
    None where the engine is not built (it is optional for the cgroup library)."""
    try:
        from ..io import read_files
    except ImportError:
        return None
    return read_files


def _plain(paths: list[Path]) -> list[bytes | None]:
    out: list[bytes | None] = []
    for p in paths:
        try:
            out.append(p.read_bytes())
        except OSError:
            out.append(None)
    return out


def read_many(paths: list[Path]) -> list[bytes | None]:
    """The contents of each path (None where it cannot be read)."""
    if not paths:
        return []
    read_files = _batched()
    if read_files is not None:
        try:
            return [
                None if isinstance(r, Exception) or r is None else bytes(r)
                for r in read_files(paths)
            ]
        except (OSError, RuntimeError):
            pass  # no ring here (old kernel, seccomp): plain reads below
    return _plain(paths)


def read_stats(
    groups: list[Cgroup], files: tuple[R.CgroupFile, ...] = R.STATS
) -> list[dict[str, Any]]:
    """For each group, {file name: parsed value} of the statistics files it has."""
    wanted = [(i, f, g.path / f.name) for i, g in enumerate(groups) for f in files]
    raw = read_many([p for *_, p in wanted])
    out: list[dict[str, Any]] = [{} for _ in groups]
    for (i, f, _), data in zip(wanted, raw, strict=True):  # one result per path
        if data is not None:
            out[i][f.name] = f.parse(data.decode())
    return out
