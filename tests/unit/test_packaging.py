"""The wheel carries every package folder, under the one `xhagent` namespace."""

import runpy
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
