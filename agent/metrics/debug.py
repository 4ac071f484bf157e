"""The agent looking at itself, like Go's pprof endpoints (served under /debug/ by the
exporter when the agent runs with --debug-endpoints):

- `stacks()`: every thread's current stack, innermost call last;
- `profile(seconds)`: a sampled CPU profile of the whole process, in collapsed-stack text
  (`frame;frame;frame count` per line, root first): what flamegraph.pl and speedscope load;
- `heap()`: glibc's heap totals (mallinfo2), Python's live blocks, gc-tracked objects
  by type and the largest containers, and the top allocation sites by size when tracemalloc traces
  (PYTHONTRACEMALLOC=N or --debug-endpoints=heap).

The profiler samples from a thread of its own, at `interval` seconds, through
`sys._current_frames()`: only threads that are running Python code or blocked in a call
show, each sample counted where it stands. Bounded: at most MAX_SECONDS per request, and
stacks are cut at MAX_DEPTH frames.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import time
import traceback
import tracemalloc
from collections import Counter

MAX_SECONDS = 60
MAX_DEPTH = 64


def _thread_names() -> dict[int, str]:
    return {t.ident: t.name for t in threading.enumerate() if t.ident is not None}


def stacks() -> str:
    names = _thread_names()
    out = []
    for ident, frame in sorted(sys._current_frames().items()):
        out.append(f"thread {names.get(ident, '?')} ({ident}):")
        out.extend(line.rstrip("\n") for line in traceback.format_stack(frame, limit=MAX_DEPTH))
        out.append("")
    return "\n".join(out)


def _collapsed(frame, thread: str) -> str:
    parts = []
    while frame is not None and len(parts) < MAX_DEPTH:
        code = frame.f_code
        parts.append(f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})")
        frame = frame.f_back
    parts.append(thread)
    return ";".join(reversed(parts))


def profile(seconds: float, interval: float = 0.01) -> str:
    """Collapsed stacks of every thread but the profiler's own, sampled for `seconds`."""
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be in (0, {MAX_SECONDS}]")
    me = threading.get_ident()
    counts: Counter[str] = Counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        names = _thread_names()
        for ident, frame in sys._current_frames().items():
            if ident != me:
                counts[_collapsed(frame, f"thread {names.get(ident, ident)}")] += 1
        time.sleep(interval)
    return "".join(f"{stack} {n}\n" for stack, n in counts.most_common())


def heap(top: int = 30) -> str:
    """Where the memory is: the C allocator's totals and the live Python objects by type
    (always), and the top allocation sites when tracemalloc traces."""
    lines = [_allocator(), _objects(top), _largest(10)]
    if not tracemalloc.is_tracing():
        lines.append(
            "tracemalloc is off: start the agent with --debug-endpoints=heap "
            "(or PYTHONTRACEMALLOC=25) to see allocation sites"
        )
    else:
        snapshot = tracemalloc.take_snapshot()
        stats = snapshot.statistics("lineno")[:top]
        total = sum(s.size for s in snapshot.statistics("filename"))
        lines.append(f"traced: {total} bytes; top {len(stats)} sites by size")
        lines += [f"{s.size} bytes in {s.count} blocks: {s.traceback}" for s in stats]
    return "\n".join(lines) + "\n"


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _allocator() -> str:
    """glibc's view (mallinfo2, glibc >= 2.33): what the heap holds, in use and free, and
    what large blocks hold in their own mappings; Python's count of its live blocks."""
    blocks = f"python: {sys.getallocatedblocks()} allocated blocks"
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return f"{blocks}; malloc: mallinfo2 not available"
    fn.restype = _MallInfo2
    m = fn()
    return (
        f"{blocks}; malloc: heap {m.arena} bytes ({m.uordblks} in use, {m.fordblks} free), "
        f"{m.hblks} mapped blocks of {m.hblkhd} bytes"
    )


def _largest(top: int) -> str:
    """The biggest containers: a structure that only grows shows here first."""
    sized = [o for o in gc.get_objects() if isinstance(o, (dict, list, set, frozenset))]
    sized.sort(key=len, reverse=True)
    rows = []
    for o in sized[:top]:
        sample = next(iter(o), None) if len(o) else None
        rows.append(f"{type(o).__name__} of {len(o)} (e.g. {repr(sample)[:60]})")
    return "largest containers: " + "; ".join(rows)


def _objects(top: int) -> str:
    counts = Counter(type(o).__qualname__ for o in gc.get_objects())
    rows = ", ".join(f"{name} {n}" for name, n in counts.most_common(top))
    return f"gc-tracked objects: {sum(counts.values())}; by type: {rows}"
