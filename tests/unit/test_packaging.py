"""The wheel carries every package folder, under the one `xhagent` namespace, and the
workload shim executable."""

import runpy
import shutil
import subprocess
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
    assert "xhagent-shim" in tool["package-data"]["xhagent.daemon"]
    assert "xhagent.daemon" in tool["packages"]
    assert "/agent/daemon/xhagent-shim" in (ROOT / ".gitignore").read_text().splitlines()
    build = runpy.run_path(str(ROOT / "native" / "shim_build.py"))
    assert build["SHIM"] == ROOT / "agent" / "daemon" / "xhagent-shim"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_shim_compiles_without_warnings(tmp_path):
    build = runpy.run_path(str(ROOT / "native" / "shim_build.py"))
    out = tmp_path / "xhagent-shim"
    assert build["build_shim"](out, extra_flags=("-Werror",))
    assert not build["build_shim"](out)  # up to date: not rebuilt
    res = subprocess.run([out], capture_output=True, text=True)
    assert res.returncode == 2 and "usage: xhagent-shim --dir TASKDIR" in res.stderr
