"""Build hooks that pyproject.toml cannot express: the cffi extensions, the BPF objects and
the workload shim and the gRPC modules.

`pip install .` and `pip install -e .` both run build_py, which compiles every
`ebpf/*.bpf.c` into `agent/bpf/objects/`, `native/shim.c` into `agent/daemon/exec/xhagent-shim`
and every `agent/**/*.proto` into `*_pb2.py` / `*_pb2_grpc.py` beside it (package data)
before the package is collected; cffi's setuptools integration builds `xhagent._uring`,
`xhagent._bpf`, `xhagent._spawn` and `xhagent._runq`, and `native/sched.c` is a plain
extension, `xhagent._sched`.
"""

import runpy
import shutil
import sys
import tempfile
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def greenlet_include() -> list[str]:
    """Where greenlet.h is: greenlet ships it inside its package (a build requirement)."""
    try:
        import greenlet
    except ImportError:
        raise SystemExit(
            "native build: greenlet is needed to build xhagent._sched (its greenlet.h):"
            " .venv/bin/pip install 'greenlet>=3.1'"
        ) from None
    return [str(Path(greenlet.__file__).resolve().parent)]


def build_grpc_modules():
    """protoc (from grpcio-tools) over every `.proto` under agent/.

    The include root maps `xhagent` to `agent`, as pyproject's package-dir does, so that
    agent/daemon/api/v1/agent.proto compiles as xhagent/daemon/api/v1/agent.proto and the generated
    `_pb2_grpc` imports `from xhagent.daemon.api.v1 import agent_pb2` without any edit. protoc
    writes under that virtual name, so it writes into a scratch folder; a module is replaced
    only when its text changed, which keeps mtimes (and bytecode) of an unchanged build.
    """
    # setuptools (>= 71, imported above) puts its vendored packaging on sys.path.
    from packaging.requirements import Requirement

    # Another protoc would make modules that demand other grpcio/protobuf versions than the
    # wheel's dependencies name; without build isolation nothing else checks the pin.
    requires = tomllib.loads((HERE / "pyproject.toml").read_text())["build-system"]["requires"]
    pin = Requirement(next(r for r in requires if r.startswith("grpcio-tools")))
    try:
        from grpc_tools import protoc

        found = version("grpcio-tools")
    except (ImportError, PackageNotFoundError):
        found = None
    if found is None or found not in pin.specifier:
        raise SystemExit(
            f"grpc build: {pin} is needed, found {found or 'none'}: "
            f".venv/bin/pip install '{pin}' (the editable install has no build isolation)"
        )
    agent = HERE / "agent"
    protos = sorted(agent.rglob("*.proto"))
    # The well-known types (google/protobuf/*.proto) ship inside grpc_tools.
    wkt = Path(protoc.__file__).with_name("_proto")
    with tempfile.TemporaryDirectory() as out:
        args = ["protoc", f"-I{wkt}", f"-Ixhagent={agent}", f"--python_out={out}"]
        args += [f"--grpc_python_out={out}", *map(str, protos)]
        if protoc.main(args) != 0:
            raise SystemExit(f"grpc build: protoc failed on {', '.join(map(str, protos))}")
        for made in sorted((Path(out) / "xhagent").rglob("*.py")):
            target = agent / made.relative_to(Path(out) / "xhagent")
            if not target.exists() or target.read_bytes() != made.read_bytes():
                tmp = target.with_suffix(".tmp")
                shutil.copyfile(made, tmp)
                tmp.replace(target)


class build_py_with_bpf(build_py):
    def run(self):
        ebpf = runpy.run_path(str(HERE / "ebpf" / "build.py"))
        ebpf["build_all"](HERE / "ebpf", HERE / "agent" / "bpf" / "objects")
        shim = runpy.run_path(str(HERE / "native" / "shim_build.py"))
        if shim["build_shim"]():
            print(f"native: built {shim['SHIM'].relative_to(HERE)}", file=sys.stderr)
        build_grpc_modules()
        super().run()


setup(
    cffi_modules=[
        "native/uring_build.py:ffibuilder",
        "native/bpf_build.py:ffibuilder",
        "native/spawn_build.py:ffibuilder",
        "native/runq_build.py:ffibuilder",
    ],
    # The scheduler's hot path (runtime.scheduler's base class): CPython's C API, not cffi,
    # since it calls greenlet switches and reads task objects without a Python frame.
    ext_modules=[
        Extension(
            "xhagent._sched",
            sources=["native/sched.c"],
            include_dirs=greenlet_include(),
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=gnu11"],
        )
    ],
    cmdclass={"build_py": build_py_with_bpf},
)
