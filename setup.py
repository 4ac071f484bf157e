"""Build hooks that pyproject.toml cannot express: the cffi extensions, the BPF objects and
the workload shim.

`pip install .` and `pip install -e .` both run build_py, which compiles every
`ebpf/*.bpf.c` into `agent/bpf/objects/` and `native/shim.c` into `agent/daemon/xhagent-shim`
(package data) before the package is collected; cffi's setuptools integration builds
`xhagent._uring`, `xhagent._bpf` and `xhagent._spawn`.
"""

import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class build_py_with_bpf(build_py):
    def run(self):
        ebpf = runpy.run_path(str(HERE / "ebpf" / "build.py"))
        ebpf["build_all"](HERE / "ebpf", HERE / "agent" / "bpf" / "objects")
        shim = runpy.run_path(str(HERE / "native" / "shim_build.py"))
        if shim["build_shim"]():
            print(f"native: built {shim['SHIM'].relative_to(HERE)}", file=sys.stderr)
        super().run()


setup(
    cffi_modules=[
        "native/uring_build.py:ffibuilder",
        "native/bpf_build.py:ffibuilder",
        "native/spawn_build.py:ffibuilder",
    ],
    cmdclass={"build_py": build_py_with_bpf},
)
