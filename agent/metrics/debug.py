"""The agent looking at itself, like Go's pprof endpoints (served under /debug/ by the
exporter when the agent runs with --debug-endpoints):

- `stacks()`: every thread's current stack, innermost call last;
- `profile(seconds)`: a sampled CPU profile of the whole process, in collapsed-stack text
  (`frame;frame;frame count` per line, root first): what flamegraph.pl and speedscope load;
- `heap()`: the top allocation sites by size, when tracemalloc traces (PYTHONTRACEMALLOC=N
  or --debug-endpoints=heap); otherwise how to turn it on.

The profiler samples from a thread of its own, at `interval` seconds, through
`sys._current_frames()`: only threads that are running Python code or blocked in a call
show, each sample counted where it stands. Bounded: at most MAX_SECONDS per request, and
stacks are cut at MAX_DEPTH frames.
"""

from __future__ import annotations

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
    if not tracemalloc.is_tracing():
        return (
            "tracemalloc is off: start the agent with --debug-endpoints=heap "
            "(or PYTHONTRACEMALLOC=25) to see allocation sites\n"
        )
    snapshot = tracemalloc.take_snapshot()
    stats = snapshot.statistics("lineno")[:top]
    total = sum(s.size for s in snapshot.statistics("filename"))
    lines = [f"traced: {total} bytes; top {len(stats)} sites by size"]
    lines += [f"{s.size} bytes in {s.count} blocks: {s.traceback}" for s in stats]
    return "\n".join(lines) + "\n"
