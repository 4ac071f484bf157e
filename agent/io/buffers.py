"""Page-aligned memory for O_DIRECT and registered (fixed) buffers, handed out as memoryviews."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .. import _uring

if TYPE_CHECKING:
    from .ring import Ring

ffi, lib = _uring.ffi, _uring.lib
PAGE = os.sysconf("SC_PAGE_SIZE")


class AlignedBuffer:
    """`size` zeroed bytes at an `alignment`-aligned address (posix_memalign), freed by close().

    `view` is a writable memoryview over the memory; `address` is what C and the kernel see.
    """

    def __init__(self, size: int, alignment: int = PAGE):
        if size <= 0:
            raise ValueError(f"buffer size must be positive, not {size}")
        self._ptr = lib.xh_aligned_alloc(alignment, size)
        if self._ptr == ffi.NULL:
            raise MemoryError(f"aligned_alloc({alignment}, {size})")
        self.size = size
        self.view = memoryview(ffi.buffer(self._ptr, size))

    @property
    def ptr(self):
        return self._ptr

    @property
    def address(self) -> int:
        return int(ffi.cast("uintptr_t", self._ptr))

    def close(self) -> None:
        if self._ptr is not None:
            # A view that outlives the memory (a traceback frame) must be dead, not dangling.
            self.view.release()
            lib.xh_aligned_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> AlignedBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return self.size


@contextmanager
def aligned_buffer(size: int, alignment: int = PAGE) -> Iterator[memoryview]:
    """A zeroed buffer aligned for O_DIRECT, freed on exit; yields a writable memoryview."""
    with AlignedBuffer(size, alignment) as buf:
        yield buf.view


class BufferPool:
    """`count` aligned buffers of `size` bytes carved from one allocation.

    acquire() hands out (index, view); register(ring) makes every buffer a fixed buffer whose
    buffer index is its pool index (read_fixed / write_fixed).
    """

    def __init__(self, count: int, size: int, alignment: int = PAGE):
        if count <= 0:
            raise ValueError(f"pool needs at least one buffer, not {count}")
        self.count, self.size = count, -(-size // alignment) * alignment
        self._memory = AlignedBuffer(self.count * self.size, alignment)
        self.views = [self._memory.view[i * self.size : (i + 1) * self.size] for i in range(count)]
        self._free = list(range(count - 1, -1, -1))

    def acquire(self) -> tuple[int, memoryview]:
        if not self._free:
            raise BufferError(f"all {self.count} pool buffers are in use")
        index = self._free.pop()
        return index, self.views[index]

    def release(self, index: int) -> None:
        if index in self._free or not 0 <= index < self.count:
            raise ValueError(f"buffer {index} is not acquired from this pool")
        self._free.append(index)

    @property
    def available(self) -> int:
        return len(self._free)

    def register(self, ring: Ring) -> None:
        ring.register_buffers(self.views)

    def close(self) -> None:
        for view in self.views:
            view.release()
        self._memory.close()

    def __enter__(self) -> BufferPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
