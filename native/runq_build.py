"""cffi (API mode) builder for `xhagent._runq`: the worker pool's run queues in shared memory.

The rings, the slot allocator and the futex sleeping are C11 atomics in runq.c; Python
sees one call per push, pop or steal. The header is plain declarations and is the cdef itself.
"""

import os
import shutil
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

if shutil.which("cc") is None and shutil.which("gcc") is None:
    sys.exit("native build: no C compiler: install the Debian package `build-essential`")

ffibuilder = FFI()
ffibuilder.cdef((HERE / "runq.h").read_text())
ffibuilder.set_source(
    "xhagent._runq",
    '#include <stdint.h>\n#include "runq.h"\n',
    # setuptools insists on paths relative to the project root (the cwd of a build).
    sources=[os.path.relpath(HERE / "runq.c")],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=gnu11"],
)
