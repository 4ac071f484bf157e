"""Compile the BPF programs in this folder (CO-RE) into objects shipped as package data.

`vmlinux.h` is generated once by bpftool from the build host's BTF; clang compiles each
`*.bpf.c` with `-target bpf`. A missing tool or header stops the build with the Debian
package that provides it.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

BTF = Path("/sys/kernel/btf/vmlinux")
# What to install when a piece is missing, by the name the build looks for.
NEEDS = {
    "clang": "clang",
    "bpftool": "bpftool",
    "llvm-strip": "llvm",
    "bpf/bpf_helpers.h": "libbpf-dev",
}


class BuildError(SystemExit):
    pass


def _fail(msg):
    raise BuildError(f"ebpf build: {msg}")


def _tool(name):
    path = shutil.which(name)
    if path is None:
        _fail(
            f"`{name}` not found: install the Debian package `{NEEDS[name]}` "
            f"(apt-get install {NEEDS[name]})"
        )
    return path


def _check_headers():
    for inc in ("/usr/include", "/usr/local/include"):
        if (Path(inc) / "bpf" / "bpf_helpers.h").exists():
            return
    _fail("bpf/bpf_helpers.h not found: install the Debian package `libbpf-dev`")


def _arch_include():
    # clang -target bpf does not search the multiarch include dir where asm/ lives.
    machine = os.uname().machine
    return f"/usr/include/{machine}-linux-gnu"


def vmlinux_header(out_dir: Path) -> Path:
    header = out_dir / "vmlinux.h"
    if header.exists() and header.stat().st_size > 0:
        return header
    if not BTF.exists():
        _fail(f"{BTF} is missing: the build host's kernel has no BTF (CONFIG_DEBUG_INFO_BTF)")
    bpftool = _tool("bpftool")
    text = subprocess.run(
        [bpftool, "btf", "dump", "file", str(BTF), "format", "c"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    tmp = header.with_suffix(".h.tmp")
    tmp.write_text(text)
    tmp.replace(header)
    return header


def compile_one(src: Path, out: Path, include_dir: Path):
    clang = _tool("clang")
    strip = _tool("llvm-strip")
    arch = {"x86_64": "x86", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    tmp = out.with_suffix(".tmp")
    cmd = [
        clang,
        "-g",
        "-O2",
        "-target",
        "bpf",
        f"-D__TARGET_ARCH_{arch}",
        "-I",
        str(include_dir),
        "-I",
        _arch_include(),
        "-Wall",
        "-Werror",
        "-c",
        str(src),
        "-o",
        str(tmp),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        _fail(f"clang failed on {src.name}:\n{res.stderr}")
    # Drop DWARF, keep BTF (.BTF/.BTF.ext are what CO-RE relocation needs).
    subprocess.run([strip, "-g", str(tmp)], check=True)
    tmp.replace(out)


def build_all(src_dir: Path, out_dir: Path):
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    _check_headers()
    out_dir.mkdir(parents=True, exist_ok=True)
    include_dir = src_dir
    vmlinux_header(include_dir)
    built = []
    for src in sorted(src_dir.glob("*.bpf.c")):
        out = out_dir / (src.name[: -len(".c")] + ".o")
        deps = [src, include_dir / "vmlinux.h", *src_dir.glob("*.h")]
        if out.exists() and all(out.stat().st_mtime >= d.stat().st_mtime for d in deps):
            continue
        compile_one(src, out, include_dir)
        built.append(out.name)
    if built:
        print(f"ebpf: built {', '.join(built)}", file=sys.stderr)
    return built


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    build_all(
        here, Path(sys.argv[1]) if len(sys.argv) > 1 else here.parent / "agent" / "bpf" / "objects"
    )
