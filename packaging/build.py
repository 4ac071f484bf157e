"""`make package`: dist/xhagent_<version>_amd64.deb and dist/xhagent-<version>.x86_64.rpm.

One staged root is built under build/package/root and both packages are made from it:

- /opt/xhagent: a private venv of Debian's /usr/bin/python3.11 holding the xhagent wheel
  (native extensions, CO-RE BPF objects, the shim, the gRPC modules) and its dependencies,
  installed from PyPI now, at build time; nothing is fetched on the node. The venv is made
  at its staging path and then made path-independent: a venv finds its prefix from the
  pyvenv.cfg beside bin/python (a symlink to /usr/bin/python3.11), so only the scripts'
  shebangs and pyvenv.cfg's informational `command` name the staging path; they are
  rewritten to /opt/xhagent, the activate scripts (of no use to a service) are dropped,
  and the build fails if the staging path is left in any file.
- /usr/bin/xhagent (a symlink to the venv's console script), the systemd units, the
  conffile /etc/xhagent/agent.yaml, /etc/xhagent/policies.d, /var/lib/xhagent, bash
  completion and a man page (both generated from the CLI by the staged interpreter, which
  proves it runs), and the copyright.

Usage: python packaging/build.py [--out dist] [--work build/package]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PREFIX = "/opt/xhagent"
PYTHON = "/usr/bin/python3.11"  # Debian 12's; the venv links to it
MAINTAINER = "xhagent maintainers <xhagent@example.org>"
SUMMARY = "node agent of the XingHua scheduler"
DESCRIPTION = """\
xhagent schedules work on one Linux node with the kernel's own mechanisms:
tasks run in cgroup v2 leaves of the agent's delegated subtree (cpuset, cpu,
io and memory settings, freeze for preemption), placement follows declarative
SchedulingPolicy and CgroupPolicy files, I/O goes through io_uring and
scheduling is traced with eBPF (CO-RE objects built in: no compiler or kernel
headers on the node). It serves a gRPC API on a unix socket and Prometheus
metrics, and runs as the systemd unit xhagent.service; its tasks' cgroups
belong to xhagent-workloads.service, which agent restarts leave alone."""
# The agent's unit, and the unit whose delegated cgroup holds the workloads.
UNITS = ("xhagent.service", "xhagent-workloads.service")
# Python packages whose console scripts stay in /opt/xhagent/bin; the rest are removed.
KEEP_SCRIPTS = {"xhagent"}


def log(msg: str) -> None:
    print(f"package: {msg}", file=sys.stderr, flush=True)


def run(*args, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("check", True)
    return subprocess.run([str(a) for a in args], **kwargs)


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


# -- the staged root ---------------------------------------------------------------------------
BUILD_REQUIRES = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]


def build_env(cache: Path) -> Path:
    """A venv of Debian's python3.11 with pyproject's build requirements: the native
    extensions must be compiled against the interpreter the node runs, not the developer's.
    Kept between builds (keyed by the requirements) in build/package-env."""
    stamp = cache / "requires.txt"
    wanted = "\n".join(BUILD_REQUIRES) + "\n"
    if not (stamp.exists() and stamp.read_text() == wanted):
        if cache.exists():
            shutil.rmtree(cache)
        log(f"making the build environment ({PYTHON}: {', '.join(BUILD_REQUIRES)})")
        run(PYTHON, "-m", "venv", cache)
        run(cache / "bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
            *BUILD_REQUIRES)  # fmt: skip
        stamp.write_text(wanted)
    return cache / "bin/python"


def checkout_files() -> list[str]:
    """What the checkout holds: tracked files and untracked ones git does not ignore (never
    build products, which may come from another interpreter)."""
    out = run(
        "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
        cwd=REPO, capture_output=True,
    ).stdout  # fmt: skip
    return [name for name in out.decode().split("\0") if name and (REPO / name).exists()]


def build_wheel(work: Path, python: Path) -> Path:
    src = work / "src"
    for name in checkout_files():
        dest = src / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest, follow_symlinks=False)
    wheels = work / "wheels"
    wheels.mkdir(parents=True)
    log("building the xhagent wheel (native extensions, BPF objects, shim, gRPC modules)")
    run(
        python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
        "--no-build-isolation", "--no-deps", "-w", wheels, src,
    )  # fmt: skip
    (wheel,) = wheels.glob("xhagent-*.whl")
    return wheel


def make_venv(root: Path, wheel: Path, python: Path) -> Path:
    venv = root / PREFIX.lstrip("/")
    venv.parent.mkdir(parents=True, exist_ok=True)
    run(PYTHON, "-m", "venv", "--without-pip", venv)
    log(f"installing {wheel.name} and its dependencies into {PREFIX} (binary wheels only)")
    run(
        python, "-m", "pip", "--python", venv / "bin/python3", "install", "-q",
        "--no-compile", "--no-warn-script-location", "--only-binary", ":all:",
        "--disable-pip-version-check", wheel,
    )  # fmt: skip
    unstage_venv(venv)
    return venv


def unstage_venv(venv: Path) -> None:
    """Make the venv name /opt/xhagent only: shebangs, pyvenv.cfg, no activate scripts."""
    staged = str(venv)
    for script in sorted((venv / "bin").iterdir()):
        if script.is_symlink():  # python, python3, python3.11
            continue
        first = script.read_bytes().split(b"\n", 1)[0]
        if script.name.startswith("activate") or script.name == "Activate.ps1":
            script.unlink()
        elif first.startswith(b"#!") and script.name not in KEEP_SCRIPTS:
            script.unlink()  # dependencies' own tools: not the product's
        elif first.startswith(b"#!" + staged.encode()):
            body = script.read_bytes().split(b"\n", 1)[1]
            script.write_bytes(f"#!{PREFIX}/bin/python3\n".encode() + body)
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace(staged, PREFIX))
    for direct in venv.glob("lib/python*/site-packages/*.dist-info/direct_url.json"):
        # pip's record of where the wheel came from: the build machine's path.
        record = direct.with_name("RECORD")
        record.write_text(
            "".join(
                line
                for line in record.read_text().splitlines(keepends=True)
                if not line.startswith(f"{direct.parent.name}/direct_url.json,")
            )
        )
        direct.unlink()
    leaks = [str(p) for p in venv.rglob("*") if p.is_file() and staged.encode() in p.read_bytes()]
    if leaks:
        raise SystemExit(f"package: the staging path is still named in {', '.join(leaks)}")


def strip_native(venv: Path) -> None:
    """Every ELF object but the BPF ones, which keep their BTF: CO-RE relocation needs it."""
    elves = [p for p in elf_files(venv) if not p.name.endswith(".bpf.o")]
    run("strip", "--strip-unneeded", "--remove-section=.comment", "--remove-section=.note",
        *elves)  # fmt: skip


def elf_files(top: Path) -> list[Path]:
    found = []
    for path in sorted(top.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        with path.open("rb") as f:
            if f.read(4) == b"\x7fELF":
                found.append(path)
    return found


def generate_docs(root: Path, venv: Path) -> None:
    """Bash completion and the man page, from the staged CLI (so they cannot drift)."""
    python = venv / "bin/python3"
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    script = venv / "bin/xhagent"
    completion = run(
        python, script, capture_output=True, text=True,
        env={**env, "_XHAGENT_COMPLETE": "bash_source"},
    ).stdout  # fmt: skip
    if "_XHAGENT_COMPLETE" not in completion:
        raise SystemExit("package: click gave no bash completion script")
    dest = root / "usr/share/bash-completion/completions/xhagent"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(completion)
    man = run(
        python, HERE / "manpage.py", version(), capture_output=True, text=True, env=env
    ).stdout
    dest = root / "usr/share/man/man1/xhagent.1.gz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(gzip.compress(man.encode(), 9, mtime=0))


def stage(work: Path, env: Path) -> Path:
    root = work / "root"
    python = build_env(env)
    wheel = build_wheel(work, python)
    venv = make_venv(root, wheel, python)
    strip_native(venv)
    generate_docs(root, venv)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/xhagent").symlink_to(f"{PREFIX}/bin/xhagent")
    # xhagent-workloads.service's ExecStart: a path that does not name the Python version
    (root / "usr/lib/xhagent").mkdir(parents=True)
    (shim,) = venv.glob("lib/python*/site-packages/xhagent/daemon/exec/xhagent-shim")
    (root / "usr/lib/xhagent/xhagent-shim").symlink_to(f"/{shim.relative_to(root)}")
    etc = root / "etc/xhagent"
    (etc / "policies.d").mkdir(parents=True)
    shutil.copyfile(HERE / "agent.yaml", etc / "agent.yaml")
    state = root / "var/lib/xhagent"
    state.mkdir(parents=True)
    state.chmod(0o750)
    doc = root / "usr/share/doc/xhagent"
    doc.mkdir(parents=True)
    shutil.copyfile(HERE / "deb/copyright", doc / "copyright")
    # Deterministic modes whatever the build machine's umask or the wheels said: programs
    # are the venv's bin/ and the shim; modules, shared objects and data are 0644.
    programs = {
        *(venv / "bin").iterdir(),
        *venv.glob("lib/python*/site-packages/xhagent/daemon/exec/xhagent-shim"),
    }
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        if path.is_dir():
            if path != state:
                path.chmod(0o755)
        else:
            path.chmod(0o755 if path in programs else 0o644)
    return root


def needed_libraries(root: Path) -> tuple[list[Path], set[str]]:
    """The ELF files of the tree and the shared libraries they need from the system (not
    the ones bundled beside them by manylinux wheels)."""
    elves, needed = [], set()
    for path in elf_files(root):
        if path.name.endswith(".bpf.o"):
            continue
        elves.append(path)
        out = run("readelf", "-dW", path, capture_output=True, text=True).stdout
        needed |= set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))
    return elves, needed - {p.name for p in elves}


# -- .deb --------------------------------------------------------------------------------------
def deb_depends(work: Path, root: Path) -> str:
    """dpkg-shlibdeps over every ELF file (the libraries bundled in wheels' *.libs folders
    are private), plus the interpreter and the maintainer scripts' tools."""
    elves, _ = needed_libraries(root)
    scratch = work / "shlibdeps"
    (scratch / "debian").mkdir(parents=True)
    (scratch / "debian/control").write_text(
        "Source: xhagent\n\nPackage: xhagent\nArchitecture: amd64\n"
    )
    private = sorted({f"-l{p.parent}" for p in elves if p.parent.name.endswith(".libs")})
    out = run(
        "dpkg-shlibdeps", "-O", "--ignore-missing-info", *private, *elves,
        cwd=scratch, capture_output=True, text=True,
    ).stdout  # fmt: skip
    shlibs = out.strip().removeprefix("shlibs:Depends=")
    return ", ".join(
        [f"python3.11 (>= {python_version()})", "adduser", "init-system-helpers (>= 1.54~)", shlibs]
    )


def python_version() -> str:
    out = run(
        "dpkg-query", "-W", "-f=${Version}", "python3.11", capture_output=True, text=True
    ).stdout
    return out.split("-")[0]


def build_deb(work: Path, root: Path, out: Path, ver: str) -> Path:
    tree = work / "deb"
    log("assembling the .deb")
    run("cp", "-a", root, tree)
    # Debian 12 keeps units in /lib/systemd/system (usr-merged or not).
    units = tree / "lib/systemd/system"
    units.mkdir(parents=True)
    for name in UNITS:
        shutil.copyfile(HERE / name, units / name)
    doc = tree / "usr/share/doc/xhagent"
    changelog = (
        f"xhagent ({ver}) unstable; urgency=medium\n\n"
        "  * Packaged as a .deb: private venv under /opt/xhagent, systemd unit\n"
        "    with cgroup delegation.\n\n"
        f" -- {MAINTAINER}  {changelog_date()}\n"
    )
    (doc / "changelog.gz").write_bytes(gzip.compress(changelog.encode(), 9, mtime=0))
    overrides = tree / "usr/share/lintian/overrides/xhagent"
    overrides.parent.mkdir(parents=True)
    shutil.copyfile(HERE / "deb/lintian-overrides", overrides)
    control = tree / "DEBIAN"
    control.mkdir()
    for script in ("postinst", "prerm", "postrm"):
        shutil.copyfile(HERE / "deb" / script, control / script)
        (control / script).chmod(0o755)
    (control / "conffiles").write_text("/etc/xhagent/agent.yaml\n")
    sums = []
    size = 0
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree)
        if rel.parts[0] == "DEBIAN":
            continue
        size += 1
        if path.is_file() and not path.is_symlink():
            size += path.stat().st_size // 1024
            if not str(rel).startswith("etc/"):
                sums.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {rel}\n")
    (control / "md5sums").write_text("".join(sums))
    description = "\n".join(f" {line}" for line in DESCRIPTION.splitlines())
    (control / "control").write_text(
        f"Package: xhagent\nVersion: {ver}\nArchitecture: amd64\nMaintainer: {MAINTAINER}\n"
        f"Installed-Size: {size}\nDepends: {deb_depends(work, root)}\n"
        "Section: admin\nPriority: optional\n"
        f"Description: {SUMMARY}\n{description}\n"
    )
    for path in control.iterdir():
        if path.name not in ("postinst", "prerm", "postrm"):
            path.chmod(0o644)
    deb = out / f"xhagent_{ver}_amd64.deb"
    run("dpkg-deb", "--root-owner-group", "-Zxz", "-z6", "--build", tree, deb,
        stdout=subprocess.DEVNULL)  # fmt: skip
    return deb


def changelog_date() -> str:
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    return time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime(epoch))


def rpm_date() -> str:
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    return time.strftime("%a %b %d %Y", time.gmtime(epoch))


# -- .rpm --------------------------------------------------------------------------------------
def build_rpm(work: Path, root: Path, out: Path, ver: str) -> Path:
    log("assembling the .rpm")
    top = work / "rpm"
    for sub in ("BUILD", "RPMS", "SPECS", "SRPMS", "BUILDROOT"):
        (top / sub).mkdir(parents=True)
    _, needed = needed_libraries(root)
    # rpm's own generator would also list the libraries bundled inside wheels and every
    # python3.11dist() of the venv: the node's needs are these sonames and the interpreter.
    requires = "\n".join(f"Requires: {soname}()(64bit)" for soname in sorted(needed))
    spec = (HERE / "rpm/xhagent.spec.in").read_text()
    spec = spec.replace("@VERSION@", ver).replace("@REQUIRES@", requires)
    spec = spec.replace("@SUMMARY@", SUMMARY).replace("@DESCRIPTION@", DESCRIPTION)
    spec = spec.replace("@MAINTAINER@", MAINTAINER).replace("@DATE@", rpm_date())
    (top / "SPECS/xhagent.spec").write_text(spec)
    license_text = Path("/usr/share/common-licenses/Apache-2.0")
    run(
        "rpmbuild", "-bb", "--quiet", "--target", "x86_64", "--define", f"_dbpath {top}/rpmdb",
        "--define", f"_topdir {top}", "--define", f"staged {root}",
        "--define", f"unit {HERE / 'xhagent.service'}",
        "--define", f"workloads_unit {HERE / 'xhagent-workloads.service'}",
        "--define", f"license_file {license_text}",
        top / "SPECS/xhagent.spec",
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    (built,) = (top / "RPMS/x86_64").glob("xhagent-*.rpm")
    rpm = out / f"xhagent-{ver}.x86_64.rpm"
    shutil.copyfile(built, rpm)
    return rpm


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    parser.add_argument("--work", type=Path, default=REPO / "build/package")
    parser.add_argument("--env", type=Path, default=REPO / "build/package-env")
    args = parser.parse_args(argv)
    started = time.monotonic()
    ver = version()
    work = args.work.resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = stage(work, args.env.resolve())
    deb = build_deb(work, root, out, ver)
    rpm = build_rpm(work, root, out, ver)
    log(f"{deb} and {rpm} in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
