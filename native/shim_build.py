"""Compile `native/shim.c` into the executable `agent/daemon/exec/xhagent-shim` (package data
of `xhagent.daemon.exec`), called by setup.py's build_py.

A separate program, not an extension module: it supervises a workload after the agent's
process is gone. spawn_glue.c is linked in, not copied: the shim starts workloads the way
Cgroup.spawn does.
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE.parent / "agent" / "daemon" / "exec" / "xhagent-shim"
SHIM_SOURCES = [
    HERE / "shim.c",
    HERE / "shim_serve.c",
    HERE / "shim_spares.c",
    HERE / "shim.h",
    HERE / "spawn_glue.c",
    HERE / "spawn_glue.h",
]
SHIM_FLAGS = ["-O2", "-Wall", "-Wextra"]


def build_shim(out: Path = SHIM, extra_flags: tuple[str, ...] = ()) -> bool:
    """Compile the shim into `out` unless it is newer than its sources; True when it was
    (re)built. A compiler's warnings are shown; an error stops the build with its output."""
    deps = [*SHIM_SOURCES, Path(__file__)]  # this file holds the flags
    if out.exists() and all(out.stat().st_mtime >= src.stat().st_mtime for src in deps):
        return False
    cc = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc") or ""]
    if not cc[0]:
        sys.exit("native build: no C compiler: install the Debian package `build-essential`")
    tmp = out.with_name(out.name + ".tmp")
    base = [*cc, *SHIM_FLAGS, *extra_flags, "-I", str(HERE), "-o", str(tmp)]
    base += [str(src) for src in SHIM_SOURCES if src.suffix == ".c"]
    # Static where the C library allows it: a dynamic glibc maps ~1.3 MiB of shared pages into
    # every shim (its RSS), against ~0.7 MiB static; and a libc upgrade cannot touch a running one.
    res = subprocess.run([*base, "-static"], capture_output=True, text=True)
    if res.returncode != 0:
        print("native build: no static C library; the shim is linked dynamically", file=sys.stderr)
        res = subprocess.run(base, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"native build: {shlex.join(base)} failed:\n{res.stderr}")
    if res.stderr:
        print(res.stderr, file=sys.stderr, end="")
    tmp.replace(out)
    return True


if __name__ == "__main__":
    build_shim(Path(sys.argv[1]) if len(sys.argv) > 1 else SHIM)
