"""io_uring I/O for the agent: rings over `xhagent._uring` (liburing), batches whose per-op
loop runs in C, O_DIRECT with IOPOLL where the device polls, batched small-file reads, and
an asyncio bridge, and a Sampler that keeps small files open and re-reads them all in one
call."""

from .aio import AsyncRing
from .batch import BatchResult, RwStream, read_batch, read_many, rw_batch, write_batch
from .buffers import AlignedBuffer, BufferPool, aligned_buffer
from .direct import DirectFile, alignment_problem, device_polls
from .files import FileReader, FileRounds, read_file_loop, read_files
from .ring import Ring, UringError, supported_ops
from .sampler import Sampler, Snapshot

__all__ = [
    "AlignedBuffer",
    "AsyncRing",
    "BatchResult",
    "BufferPool",
    "DirectFile",
    "FileReader",
    "FileRounds",
    "Ring",
    "RwStream",
    "Sampler",
    "Snapshot",
    "UringError",
    "aligned_buffer",
    "alignment_problem",
    "device_polls",
    "read_batch",
    "read_file_loop",
    "read_files",
    "read_many",
    "rw_batch",
    "supported_ops",
    "write_batch",
]
