"""The wheel carries every package folder, under the one `xhagent` namespace, and the
workload shim executable and the gRPC modules protoc generates at build time."""

import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_and_mapped():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = tool["package-dir"]
    assert all(name == "xhagent" or name.startswith("xhagent.") for name in mapping)
    found = set()
    for name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    # Data-only folders (BPF objects) are listed explicitly too, so their files ship.
    assert found <= set(tool["packages"]), (
        f"missing from [tool.setuptools] packages: {found - set(tool['packages'])}"
    )
    assert "xhagent.bpf.objects" in tool["packages"]


def test_ebpf_build_names_the_debian_package_of_a_missing_tool(monkeypatch):
    build = runpy.run_path(str(ROOT / "ebpf" / "build.py"))
    monkeypatch.setenv("PATH", "/nonexistent")
    for tool, package in (("clang", "clang"), ("bpftool", "bpftool"), ("llvm-strip", "llvm")):
        with pytest.raises(SystemExit, match=f"install the Debian package `{package}`"):
            build["_tool"](tool)


def test_the_shim_executable_ships_as_package_data_and_stays_out_of_git():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "xhagent-shim" in tool["package-data"]["xhagent.daemon.exec"]
    assert "xhagent.daemon" in tool["packages"]
    assert "/agent/daemon/exec/xhagent-shim" in (ROOT / ".gitignore").read_text().splitlines()
    build = runpy.run_path(str(ROOT / "native" / "shim_build.py"))
    assert build["SHIM"] == ROOT / "agent" / "daemon" / "exec" / "xhagent-shim"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_shim_compiles_without_warnings(tmp_path):
    build = runpy.run_path(str(ROOT / "native" / "shim_build.py"))
    out = tmp_path / "xhagent-shim"
    assert build["build_shim"](out, extra_flags=("-Werror",))
    assert not build["build_shim"](out)  # up to date: not rebuilt
    res = subprocess.run([out], capture_output=True, text=True)
    assert res.returncode == 2 and "usage: xhagent-shim --dir TASKDIR" in res.stderr


def _requirement_floor(requirements, name):
    for req in requirements:
        if m := re.fullmatch(rf"{re.escape(name)}\s*>=\s*([0-9.]+)(,\s*<\s*([0-9.]+))?", req):
            return tuple(map(int, m[1].split("."))), m[3]
    raise AssertionError(f"{name} is not among {requirements}")


def test_dependency_floors_are_what_the_generated_modules_check():
    # The generated modules refuse, at import, a runtime older than the protoc that made them.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    v1 = ROOT / "agent" / "daemon" / "api" / "v1"
    pb2 = (v1 / "agent_pb2.py").read_text()
    gencode = re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", pb2).groups()
    grpc_made = re.search(
        r"GRPC_GENERATED_VERSION = '([0-9.]+)'", (v1 / "agent_pb2_grpc.py").read_text()
    )
    floor, cap = _requirement_floor(project["dependencies"], "protobuf")
    assert floor >= tuple(map(int, gencode))
    assert cap == str(int(gencode[0]) + 1)  # a new major of the runtime refuses old gencode
    assert _requirement_floor(project["dependencies"], "grpcio")[0] >= tuple(
        map(int, grpc_made[1].split("."))
    )


def test_makefile_bootstraps_the_build_requirements_and_rebuilds_on_a_changed_proto():
    # The editable install runs without build isolation: the venv must already hold them.
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    makefile = (ROOT / "Makefile").read_text()
    bootstrap = re.search(r"^\t\$\(BIN\)/python -m pip install -q --upgrade (.*)$", makefile, re.M)
    installed = shlex.split(bootstrap[1])
    for req in requires:
        name = re.match(r"[A-Za-z0-9_.-]+", req)[0]
        assert name in installed or req in installed, f"Makefile bootstrap lacks {req}"
    # Its pin too: another protoc makes modules that the dependency floors do not match.
    (tools,) = (req for req in requires if req.startswith("grpcio-tools"))
    assert tools in installed
    sources = re.search(r"^NATIVE_SOURCES := (.*)$", makefile, re.M)[1]
    assert "agent/daemon/api/v1/*.proto" in sources


def test_build_puts_the_grpc_modules_and_the_proto_in_the_package(tmp_path):
    # A wheel is build_py's tree plus the compiled extensions; build_py is where protoc runs.
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    v1 = tmp_path / "xhagent" / "daemon" / "api" / "v1"
    assert {p.name for p in v1.iterdir()} >= {
        "__init__.py",
        "agent.proto",
        "agent_pb2.py",
        "agent_pb2_grpc.py",
    }
    # The generated import line resolves inside the built `xhagent`, not in the source tree.
    probe = (
        "import xhagent.daemon.api.v1.agent_pb2_grpc as m, xhagent as x; "
        "print(m.__file__, x.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert out == [str(v1 / "agent_pb2_grpc.py"), str(tmp_path / "xhagent" / "__init__.py")]
