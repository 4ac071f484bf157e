"""Stacks of a trace: taken by the BPF program at each switch-out (a switch record's aux is
its kernel stack's id + 1, its ustack its user stack's), named at the end of the recording,
kernel frames from /proc/kallsyms and user frames from the mapped files (ustacks.py), so
that the trace reads the same after a reboot or on another machine, and kept in the trace
file's stacks section (fmt.py): frames deduplicated, each stack a list of frame indices.

A frame is (address, symbol, offset, module): module "[kernel.kallsyms]" for the kernel
image, as perf names it, the module's name in brackets for a kernel module, the file's
path for user code. An address no symbol covers keeps its address alone (symbol
"[unknown]", as perf prints it).
"""

from __future__ import annotations

import json
import zlib
from bisect import bisect_right
from collections.abc import Callable, Iterable
from typing import NamedTuple

KERNEL = "[kernel.kallsyms]"
UNKNOWN = "[unknown]"
MAX_SECTION = 64 << 20  # the stacks section's bytes at most (16,384 stacks of 127 frames fit)
# The BPF program's own frames and the tracepoint's, innermost, above the scheduler's: the
# stack starts where the task left the CPU (__schedule), as perf's does.
_TRACING = ("bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_", "__bpf_prog_")


class Frame(NamedTuple):
    addr: int
    symbol: str
    offset: int
    module: str

    def perf(self) -> str:
        """The frame as a `perf script -g` line prints it (without the leading tab)."""
        name = self.symbol if self.symbol == UNKNOWN else f"{self.symbol}+0x{self.offset:x}"
        return f"{self.addr:16x} {name} ({self.module})"


class KernelSymbols:
    """Text symbols of /proc/kallsyms, sorted by address, for naming return addresses."""

    def __init__(self, kallsyms: str):
        syms: list[tuple[int, str, str]] = []
        for line in kallsyms.splitlines():
            parts = line.split()
            if len(parts) < 3 or parts[1] not in ("t", "T", "w", "W"):
                continue
            try:
                addr = int(parts[0], 16)
            except ValueError:
                continue
            module = f"[{parts[3].strip('[]')}]" if len(parts) > 3 else KERNEL
            syms.append((addr, parts[2], module))
        syms.sort()
        self._addrs = [a for a, _, _ in syms]
        self._syms = syms
        # kptr_restrict hides the addresses (all read 0) from a reader without CAP_SYSLOG
        self.hidden = not any(self._addrs)

    @classmethod
    def from_proc(cls, path: str = "/proc/kallsyms") -> KernelSymbols:
        with open(path, encoding="utf-8", errors="replace") as f:
            return cls(f.read())

    def frame(self, addr: int) -> Frame:
        i = bisect_right(self._addrs, addr) - 1
        if self.hidden or i < 0:
            return Frame(addr, UNKNOWN, 0, KERNEL)
        base, name, module = self._syms[i]
        return Frame(addr, name, addr - base, module)


class StackFrames:
    """The Trace Event format's `stackFrames`: a tree of frames, each node {"name",
    "category", "parent"} under an id, one per distinct path from the outermost frame, so
    that an event names a whole stack by its innermost node (`esf`: its end stack)."""

    def __init__(self):
        self._ids: dict[tuple[str | None, str], str] = {}
        self.nodes: dict[str, dict] = {}

    def node(self, frames: list[Frame]) -> str | None:
        """The id of the stack `frames` (innermost first); None for an empty one."""
        parent = None
        for f in reversed(frames):
            key = (parent, f.symbol)
            if key not in self._ids:
                self._ids[key] = str(len(self._ids) + 1)
                node = {"name": f.symbol, "category": f.module}
                if parent is not None:
                    node["parent"] = parent
                self.nodes[self._ids[key]] = node
            parent = self._ids[key]
        return parent


def trim_tracing(frames: list[Frame]) -> list[Frame]:
    """The stack without the tracing machinery's frames at its top."""
    i = 0
    while i < len(frames) and frames[i].symbol.startswith(_TRACING):
        i += 1
    return frames[i:]


def stack_ids(auxes: Iterable[int]) -> set[int]:
    """The stack ids a trace's switch records name (aux = id + 1; 0 is none)."""
    return {aux - 1 for aux in auxes if aux}


class Stacks:
    """A trace's stacks: kernel ones by id, user ones by (tgid, id): a user stack's id
    is its addresses', which mean something else in another process."""

    def __init__(
        self,
        kernel: dict[int, list[Frame]] | None = None,
        user: dict[tuple[int, int], list[Frame]] | None = None,
    ):
        self.kernel = kernel or {}
        self.user = user or {}

    def __bool__(self) -> bool:
        return bool(self.kernel or self.user)

    def of(self, aux: int, ustack: int, tgid: int) -> list[Frame]:
        """A switch-out's frames, innermost first: its kernel stack, then its user stack
        (as `perf script -g` prints them); [] for none."""
        kernel = self.kernel.get(aux - 1, []) if aux else []
        user = self.user.get((tgid, ustack - 1), []) if ustack else []
        return kernel + user if user else kernel


def encode_section(
    kernel: dict[int, list[Frame]], user: dict[tuple[int, int], list[Frame]] | None = None
) -> bytes:
    """The stacks section's bytes: zlib-compressed JSON {"frames": [[addr, symbol, offset,
    module], ...], "kernel": {id: [frame index, ...]}, "user": {"TGID/ID": [...]}}, each
    stack innermost frame first."""
    index: dict[Frame, int] = {}

    def indices(frames: list[Frame]) -> list[int]:
        return [index.setdefault(f, len(index)) for f in frames]

    doc: dict = {"kernel": {str(sid): indices(kernel[sid]) for sid in sorted(kernel)}}
    if user:
        doc["user"] = {f"{t}/{sid}": indices(user[(t, sid)]) for t, sid in sorted(user)}
    doc["frames"] = [list(f) for f in index]
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def kernel_frames(ids: Iterable[int], lookup: Callable[[int], list[int]], syms: KernelSymbols):
    """Kernel stack id -> its frames named, without the tracing machinery's."""
    return {sid: trim_tracing([syms.frame(ip) for ip in lookup(sid)]) for sid in ids}


def decode_section(data: bytes) -> Stacks:
    """The stacks of encode_section's bytes; ValueError for anything else."""
    try:
        doc = json.loads(zlib.decompressobj().decompress(data, MAX_SECTION * 4))
        frames = [Frame(int(a), str(s), int(o), str(m)) for a, s, o, m in doc["frames"]]
        kernel = {int(k): [frames[i] for i in v] for k, v in doc["kernel"].items()}
        user = {}
        for k, v in doc.get("user", {}).items():
            tgid, _, sid = k.partition("/")
            user[(int(tgid), int(sid))] = [frames[i] for i in v]
        return Stacks(kernel, user)
    except (zlib.error, ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        raise ValueError(f"stacks section unreadable: {exc}") from None
