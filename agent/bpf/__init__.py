"""eBPF for the agent: libbpf CO-RE objects built from `ebpf/*.bpf.c`, loaded through
the cffi binding `xhagent._bpf`. One BPF program = one small module here."""

from .loader import (
    BpfError,
    BpfObject,
    Link,
    Map,
    Program,
    RingBuffer,
    decode,
    format_error,
    object_path,
    perf_event_open,
    possible_cpus,
)

__all__ = [
    "BpfError",
    "BpfObject",
    "Link",
    "Map",
    "Program",
    "RingBuffer",
    "decode",
    "format_error",
    "object_path",
    "perf_event_open",
    "possible_cpus",
]
