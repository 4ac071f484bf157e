"""cffi (API mode) builder for `xhagent._spawn`: start a process already inside a cgroup v2 group.

Python cannot run in a child made by a raw clone3 (it copies one thread of an interpreter
that has not prepared for it), and neither `os.posix_spawn` nor `subprocess` can ask for
CLONE_INTO_CGROUP; so the child's side is C, in spawn_glue.c. The header is plain
declarations and is the cdef itself.
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
ffibuilder.cdef((HERE / "spawn_glue.h").read_text())
ffibuilder.set_source(
    "xhagent._spawn",
    '#include <stdint.h>\n#include "spawn_glue.h"\n',
    # setuptools insists on paths relative to the project root (the cwd of a build).
    sources=[os.path.relpath(HERE / "spawn_glue.c")],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-O2", "-Wall"],
)
