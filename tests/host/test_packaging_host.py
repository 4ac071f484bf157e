"""`make package`'s .deb and .rpm, built once per session (the `packages` fixture of
tests/host/conftest.py, shared with the boot test), checked as a node would get them: metadata,
file lists, conffiles, lintian, the unit, the maintainer scripts' behaviour, and the packaged
venv running the agent from /opt/xhagent.

Nothing lands on the host: the packaged tree is run from a scratch copy bound over /opt in
a private mount namespace, and the maintainer scripts run with /etc, /var/lib and /run
overlaid (writes go to a scratch folder) and the system tools they call stubbed.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.host

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
XHAGENT = Path(sys.executable).with_name("xhagent")
SITE = "opt/xhagent/lib/python3.11/site-packages"
# What the node gets beside the venv; each one is asserted in both packages.
PRODUCT_FILES = {
    "usr/bin/xhagent",
    "opt/xhagent/bin/xhagent",
    "opt/xhagent/bin/python3",
    "opt/xhagent/pyvenv.cfg",
    "etc/xhagent/agent.yaml",
    "usr/share/bash-completion/completions/xhagent",
    "usr/share/man/man1/xhagent.1.gz",
    "usr/share/doc/xhagent/copyright",
    f"{SITE}/xhagent/_uring.abi3.so",
    f"{SITE}/xhagent/_bpf.abi3.so",
    f"{SITE}/xhagent/_spawn.abi3.so",
    f"{SITE}/xhagent/_runq.abi3.so",
    f"{SITE}/xhagent/daemon/exec/xhagent-shim",
    f"{SITE}/xhagent/daemon/api/v1/agent_pb2.py",
    f"{SITE}/xhagent/bpf/objects/runqlat.bpf.o",
    f"{SITE}/grpc/__init__.py",
    f"{SITE}/google/protobuf/__init__.py",
}
PRODUCT_DIRS = {"etc/xhagent/policies.d", "var/lib/xhagent"}
# Where the two formats differ on purpose (packaging/README.md).
DEB_ONLY = {"usr/share/doc/xhagent/changelog.gz", "usr/share/lintian/overrides/xhagent"}
RPM_ONLY = {"usr/share/licenses/xhagent/LICENSE"}
DEB_UNIT = "lib/systemd/system/xhagent.service"
RPM_UNIT = "usr/lib/systemd/system/xhagent.service"
# The unit whose delegated cgroup holds the workloads (never restarted with the agent).
DEB_WORKLOADS = "lib/systemd/system/xhagent-workloads.service"
RPM_WORKLOADS = "usr/lib/systemd/system/xhagent-workloads.service"
WORKLOADS_SUBTREE = "system.slice/xhagent-workloads.service"


def sh(*args, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 600)
    return subprocess.run([str(a) for a in args], **kwargs)


@pytest.fixture(scope="module")
def deb_tree(packages, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("deb-x")
    res = sh("dpkg-deb", "-x", packages[0], root)
    assert res.returncode == 0, res.stderr
    return root


def deb_entries(deb: Path) -> dict[str, tarfile.TarInfo]:
    data = sh("dpkg-deb", "--fsys-tarfile", deb, text=False).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {
            m.name.removeprefix("./").rstrip("/"): m for m in tar.getmembers() if m.name != "./"
        }


def rpm_query(rpm: Path, *query: str) -> str:
    # A database of its own: Debian's rpm would otherwise make one in ~/.rpmdb.
    res = sh("rpm", "--dbpath", rpm.parent / "rpmdb", "-qp", *query, rpm)
    assert res.returncode == 0, res.stderr
    return res.stdout


def in_opt(tree: Path, *command: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command with `tree`/opt/xhagent bound at /opt/xhagent, in a private mount
    namespace over a tmpfs /opt: the packaged venv at its real path, the host untouched."""
    script = (
        'mount -t tmpfs xhagent-test /opt && mkdir /opt/xhagent && mount --bind "$0" '
        '/opt/xhagent && exec "$@"'
    )
    base = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    return sh(
        "unshare", "--mount", "--propagation", "private", "sh", "-c", script,
        tree / "opt/xhagent", *command, env={**base, **(env or {})},
    )  # fmt: skip


# -- the .deb ------------------------------------------------------------------------------------
def test_deb_metadata_depends_and_conffiles(packages):
    deb = packages[0]
    fields = {
        name: sh("dpkg-deb", "-f", deb, name).stdout.strip()
        for name in ("Package", "Version", "Architecture", "Depends", "Section")
    }
    assert fields["Package"] == "xhagent" and fields["Version"] == VERSION
    assert fields["Architecture"] == "amd64" and fields["Section"] == "admin"
    depends = {d.split()[0] for d in fields["Depends"].split(", ")}
    # The interpreter the venv links to, what the native extensions link to (found by
    # dpkg-shlibdeps, not typed by hand), and what the maintainer scripts call.
    assert {"python3.11", "libbpf1", "liburing2", "libc6", "adduser"} <= depends, depends
    assert "init-system-helpers" in depends
    # Nothing from PyPI or Debian's python3-* stack: the venv carries it.
    assert not any(d.startswith("python3-") for d in depends), depends
    info = sh("dpkg-deb", "--info", deb).stdout
    for part in ("conffiles", "postinst", "prerm", "postrm", "md5sums"):
        assert part in info, info
    conffiles = sh("dpkg-deb", "--ctrl-tarfile", deb, text=False).stdout
    with tarfile.open(fileobj=io.BytesIO(conffiles)) as tar:
        text = tar.extractfile("./conffiles").read().decode()
    assert text.split() == ["/etc/xhagent/agent.yaml"]


def test_deb_holds_the_product(packages):
    entries = deb_entries(packages[0])
    missing = (PRODUCT_FILES | PRODUCT_DIRS | {DEB_UNIT, DEB_WORKLOADS}) - entries.keys()
    assert not missing, missing
    assert entries["usr/bin/xhagent"].issym()
    assert entries["usr/bin/xhagent"].linkname == "/opt/xhagent/bin/xhagent"
    assert entries["opt/xhagent/bin/python3.11"].linkname == "/usr/bin/python3.11"
    assert entries["var/lib/xhagent"].isdir() and entries["var/lib/xhagent"].mode == 0o750
    for name, member in entries.items():
        assert member.uname == "root" and member.gname == "root", name
    # Built, not to be built: no C or BPF source of ours, so nothing to compile on the node.
    assert not [n for n in entries if n.startswith(f"{SITE}/xhagent/") and n.endswith((".c", ".h"))]
    # Bytecode is compiled on the node (postinst), for its interpreter, and removed by prerm.
    assert not [n for n in entries if "__pycache__" in n or n.endswith(".pyc")]
    # pip's tools and the venv's activate scripts, which named the build machine: gone.
    assert {n for n in entries if n.startswith("opt/xhagent/bin/")} == {
        "opt/xhagent/bin/" + b for b in ("python", "python3", "python3.11", "xhagent")
    }


def test_deb_tree_names_no_build_path(deb_tree):
    """The venv was made at a staging path; not one file may still name it (or the
    developer's interpreter)."""
    needles = [b"build/package/root", b"/.venv/", b".pyenv"]
    hits = []
    for path in deb_tree.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path.relative_to(deb_tree)}: {n!r}" for n in needles if n in data]
    assert not hits, hits[:20]
    cfg = (deb_tree / "opt/xhagent/pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg and "/opt/xhagent" in cfg
    shebang = (deb_tree / "opt/xhagent/bin/xhagent").read_text().splitlines()[0]
    assert shebang == "#!/opt/xhagent/bin/python3"


def test_the_conffile_is_commented_defaults_that_parse(deb_tree):
    from xhagent.config import FIELDS, parse_config

    text = (deb_tree / "etc/xhagent/agent.yaml").read_text()
    # As shipped: every line a comment, so the agent runs on its defaults.
    assert parse_config(text, "agent.yaml").node_name
    assert all(not line or line.startswith("#") for line in text.splitlines())
    # Uncommented, each example is a valid value of a real field, and every field is shown.
    lines = [line[2:] for line in text.splitlines() if re.match(r"# [a-z][A-Za-z]*: ", line)]
    shown = [line.split(":")[0] for line in lines]
    assert sorted(shown) == sorted(FIELDS)
    config = parse_config("\n".join(lines) + "\n", "agent.yaml")
    assert str(config.socket) == "/run/xhagent/xhagent.sock"
    assert str(config.state_dir) == "/var/lib/xhagent"
    assert str(config.policies_dir) == "/etc/xhagent/policies.d"


def test_completion_and_man_page_come_from_the_cli(deb_tree):
    completion = (deb_tree / "usr/share/bash-completion/completions/xhagent").read_text()
    assert "_XHAGENT_COMPLETE=bash_complete" in completion
    assert "complete -o nosort -F _xhagent_completion xhagent" in completion
    res = sh(
        "man", "--warnings", "-l", "-Tutf8", "-E", "UTF-8",
        deb_tree / "usr/share/man/man1/xhagent.1.gz", env={**os.environ, "MANWIDTH": "100"},
    )  # fmt: skip
    assert res.returncode == 0 and not res.stderr, res.stderr
    page = res.stdout
    from xhagent.cli import COMMANDS

    for name in COMMANDS:
        assert f"xhagent {name}" in page, name
    assert "--metrics-addr" in page and "/etc/xhagent/agent.yaml" in page


def test_lintian_reports_no_errors(packages):
    res = sh("lintian", "--no-tag-display-limit", packages[0], timeout=300)
    lines = res.stdout.splitlines()
    errors = [line for line in lines if line.startswith("E:")]
    assert not errors, "\n".join(errors)
    # The warnings packaging/README.md lists, and no others.
    tags = {line.split()[2] for line in lines if line.startswith("W:")}
    assert tags <= {"non-standard-dir-perm", "script-not-executable", "unusual-interpreter"}, tags


# -- the unit --------------------------------------------------------------------------------------
def verify_root(deb_tree: Path, tmp_path: Path) -> Path:
    """The packaged files plus this host's units (the targets xhagent.service orders after)."""
    root = tmp_path / "root"
    shutil.copytree(deb_tree, root, symlinks=True)
    shutil.copytree(
        "/lib/systemd/system", root / "lib/systemd/system", symlinks=True, dirs_exist_ok=True
    )
    return root


def analyze_verify(root: Path) -> subprocess.CompletedProcess:
    # --root resolves ExecStart= (/usr/bin/xhagent -> /opt/xhagent/bin/xhagent) inside the
    # packaged tree; Documentation=man:xhagent(1) is looked up in its man pages.
    env = {**os.environ, "MANPATH": str(root / "usr/share/man"), "SYSTEMD_LOG_LEVEL": "notice"}
    units = ("xhagent.service", "xhagent-workloads.service")
    return sh("systemd-analyze", "verify", f"--root={root}", *units, env=env)


def test_systemd_analyze_verify_is_clean(deb_tree, tmp_path):
    root = verify_root(deb_tree, tmp_path)
    res = analyze_verify(root)
    assert res.returncode == 0 and not res.stdout and not res.stderr, res.stdout + res.stderr
    # The same check on a broken copy speaks up: the clean result above means something.
    unit = root / DEB_UNIT
    unit.write_text(unit.read_text().replace("KillMode=process", "KillMode=procces"))
    (root / "opt/xhagent/bin/xhagent").unlink()
    (root / "usr/lib/xhagent/xhagent-shim").unlink()
    workloads = root / DEB_WORKLOADS
    workloads.write_text(workloads.read_text().replace("Delegate=cpu", "Delegate=cpux"))
    res = analyze_verify(root)
    assert "kill mode" in res.stderr and "/usr/bin/xhagent" in res.stderr, res.stderr
    assert "cpux" in res.stderr and "/usr/lib/xhagent/xhagent-shim" in res.stderr, res.stderr


def unit_settings(path: Path) -> dict[str, str]:
    settings = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key] = value
    return settings


def test_unit_settings(deb_tree):
    settings = unit_settings(deb_tree / DEB_UNIT)
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "main"
    assert settings["ExecStart"].split()[:2] == ["/usr/bin/xhagent", "run"]
    # The subtree is the workloads unit's cgroup; the agent's own unit is not delegated, so
    # its cgroup stays a leaf that systemd can always start the agent in again (systemd 252).
    exec_start = settings["ExecStart"].split()
    assert exec_start[exec_start.index("--subtree") + 1] == WORKLOADS_SUBTREE
    # Workloads start from the workloads unit's server, so this unit's sandbox binds none.
    workloads = unit_settings(deb_tree / DEB_WORKLOADS)
    server = workloads["ExecStart"].split()
    at = server[server.index("--serve-at") + 1]
    assert exec_start[exec_start.index("--shim-server") + 1] == at
    assert "Delegate" not in settings
    assert settings["Wants"] == settings["PartOf"] == "xhagent-workloads.service"
    assert "xhagent-workloads.service" in settings["After"].split()
    assert settings["KillMode"] == "process"
    assert settings["Restart"] == "on-failure"
    assert settings["RuntimeDirectory"] == "xhagent" and settings["StateDirectory"] == "xhagent"
    # Every capability the doctor's capabilities item requires survives the bounding set.
    from xhagent.doctor.system_probe import NEEDED

    bounding = set(settings["CapabilityBoundingSet"].split())
    assert {f"CAP_{c}" for c in NEEDED} <= bounding
    # The agent writes its cgroups and a sysctl; these would break it.
    for breaking in ("ProtectControlGroups", "ProtectKernelTunables", "DelegateSubgroup"):
        assert breaking not in settings, breaking


def test_workloads_unit_settings(deb_tree):
    settings = unit_settings(deb_tree / DEB_WORKLOADS)
    # The shim server keeps the delegated cgroup alive; stopping it never kills a workload,
    # and nothing restarts it (systemd 252 could not place its new process: EBUSY).
    assert settings["Delegate"].split() == ["cpu", "cpuset", "io", "memory", "pids"]
    server = settings["ExecStart"].split()
    assert server[:2] == ["/usr/lib/xhagent/xhagent-shim", "--serve-at"]
    assert server[2] == "/run/xhagent-workloads/shims.sock"
    shim = f"/{SITE}/xhagent/daemon/exec/xhagent-shim"  # (a path without the Python version)
    assert os.readlink(deb_tree / server[0][1:]) == shim and (deb_tree / shim[1:]).is_file()
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "main"
    assert settings["RuntimeDirectory"] == "xhagent-workloads"
    assert settings["RuntimeDirectoryMode"] == "0700"
    assert settings["TasksMax"] == "infinity"  # all workloads together: no DefaultTasksMax
    assert settings["KillMode"] == "process"
    assert "Restart" not in settings and "DelegateSubgroup" not in settings
    assert settings["WantedBy"] == "multi-user.target"


# -- the packaged venv, run ------------------------------------------------------------------------
def test_packaged_agent_runs_from_opt_with_what_the_checkout_has(deb_tree):
    """`/usr/bin/xhagent` of the package, with the package's /opt/xhagent at its real path:
    the doctor finds the same kernel features the checkout's agent finds, so the native
    extensions, BPF objects and shim all load from the package."""
    res = in_opt(deb_tree, deb_tree / "usr/bin/xhagent", "version")
    assert res.returncode == 0, res.stderr
    assert f"xhagent {VERSION}" in res.stdout and "python 3.11" in res.stdout
    assert "uring built, bpf built, spawn built" in res.stdout, res.stdout
    packaged = in_opt(deb_tree, deb_tree / "usr/bin/xhagent", "doctor", "--json")
    checkout = sh(XHAGENT, "doctor", "--json")
    assert checkout.returncode == 0, checkout.stderr
    assert packaged.returncode == 0, packaged.stderr
    ok_packaged = set(json.loads(packaged.stdout)["ok"])
    ok_checkout = set(json.loads(checkout.stdout)["ok"])
    # Items that probe the filesystem the command runs from may differ; the rest may not.
    assert ok_checkout - ok_packaged == set(), ok_checkout - ok_packaged
    assert {"io_uring", "ebpf.tp_btf_sched_switch", "cgroup.spawn"} <= ok_packaged


def test_packaged_venv_is_isolated_from_the_host_python(deb_tree):
    code = (
        "import sys, xhagent, grpc, google.protobuf as pb;"
        "print(sys.prefix, xhagent.__file__, grpc.__file__, pb.__version__, sys.flags.no_site)"
    )
    res = in_opt(deb_tree, "/opt/xhagent/bin/python3", "-c", code)
    assert res.returncode == 0, res.stderr
    prefix, agent, grpc_file, pb_version, _ = res.stdout.split()
    assert prefix == "/opt/xhagent"
    assert agent.startswith("/opt/xhagent/lib/python3.11/site-packages/xhagent/")
    assert grpc_file.startswith("/opt/xhagent/")
    assert pb_version.startswith("7.")


# -- the .rpm --------------------------------------------------------------------------------------
def test_rpm_metadata_and_requires(packages):
    rpm = packages[1]
    info = rpm_query(rpm, "-i")
    assert "Name        : xhagent" in info and f"Version     : {VERSION}" in info
    assert "Architecture: x86_64" in info and "License     : Apache-2.0" in info
    requires = set(rpm_query(rpm, "--requires").split("\n"))
    assert {"/usr/bin/python3.11", "libbpf.so.1()(64bit)", "liburing.so.2()(64bit)"} <= requires
    # Libraries bundled inside the venv's wheels are not asked of the node.
    assert not [r for r in requires if ".libs" in r or r.startswith("python3.11dist")]
    assert rpm_query(rpm, "-c").split() == ["/etc/xhagent/agent.yaml"]
    scripts = rpm_query(rpm, "--scripts")
    assert "groupadd -r xhagent" in scripts.split("postinstall scriptlet")[0]  # in %pre
    assert "try-restart xhagent.service" in scripts  # an upgrade restarts the agent only
    assert "try-restart xhagent-workloads" not in scripts
    assert "disable --now xhagent.service xhagent-workloads.service" in scripts  # erase stops


def test_rpm_file_list_matches_the_deb(packages):
    deb_all = deb_entries(packages[0])
    deb_files = {n for n, m in deb_all.items() if not m.isdir()}
    renamed = {DEB_UNIT: RPM_UNIT, DEB_WORKLOADS: RPM_WORKLOADS}
    deb_files = {renamed.get(n, n) for n in deb_files} - DEB_ONLY
    dump = rpm_query(packages[1], "--dump").splitlines()
    rpm_files, rpm_dirs = set(), set()
    for line in dump:
        path, mode = line.split()[0].lstrip("/"), int(line.split()[4], 8)
        (rpm_dirs if mode & 0o170000 == 0o040000 else rpm_files).add(path)
    assert rpm_files - RPM_ONLY == deb_files, (
        sorted(rpm_files - RPM_ONLY - deb_files)[:10],
        sorted(deb_files - rpm_files)[:10],
    )
    assert PRODUCT_DIRS <= rpm_dirs and rpm_dirs <= deb_all.keys()
    assert "etc/xhagent" in rpm_dirs and "opt/xhagent" in rpm_dirs
    # Owned: /usr and /etc themselves are the distribution's.
    assert not {"usr", "etc", "opt", "var/lib", "usr/bin"} & rpm_dirs


def test_rpm_installs_into_a_scratch_root_and_runs(packages, tmp_path):
    root = tmp_path / "rpmroot"
    root.mkdir()
    # --nodeps: the scratch root's rpm database knows none of the node's packages (glibc,
    # python3.11, libbpf); --noscripts: the scriptlets run chrooted in the root, which has
    # no shell. Both are checked otherwise: --requires above, the scripts' text above.
    db = ("--dbpath", "/var/lib/rpm")  # inside the root, where RPM distributions keep it
    res = sh("rpm", "--root", root, *db, "-i", "--nodeps", "--noscripts", packages[1])
    assert res.returncode == 0, res.stderr
    res = sh("rpm", "--root", root, *db, "-q", "xhagent")
    assert res.stdout.strip() == f"xhagent-{VERSION}-1.x86_64"
    assert sh("rpm", "--root", root, *db, "-V", "--nodeps", "xhagent").returncode == 0
    assert (root / "var/lib/rpm").is_dir()
    for name in PRODUCT_FILES | {RPM_UNIT}:
        assert (root / name).exists() or (root / name).is_symlink(), name
    assert (root / "var/lib/xhagent").stat().st_mode & 0o777 == 0o750
    res = in_opt(root, root / "usr/bin/xhagent", "version")
    assert res.returncode == 0 and f"xhagent {VERSION}" in res.stdout, res.stderr


# -- maintainer scripts, run ---------------------------------------------------------------------
STUBS = {
    # No group yet: postinst must create it.
    "getent": 'echo "getent $*" >> "$XH_LOG"; exit 2',
    "addgroup": 'echo "addgroup $*" >> "$XH_LOG"',
    "groupadd": 'echo "groupadd $*" >> "$XH_LOG"',
    "deb-systemd-helper": 'echo "deb-systemd-helper $*" >> "$XH_LOG"; exit 0',
    "deb-systemd-invoke": 'echo "deb-systemd-invoke $*" >> "$XH_LOG"',
    "systemctl": 'echo "systemctl $*" >> "$XH_LOG"',
}


def deb_scripts(deb: Path, tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    control = tmp_path / "control"
    assert sh("dpkg-deb", "-e", deb, control).returncode == 0
    return control


def rpm_scripts(rpm: Path, tmp_path: Path) -> Path:
    """The .rpm's scriptlets as files named pre, post, preun, postun (all /bin/sh)."""
    folder = tmp_path / "scriptlets"
    folder.mkdir(parents=True)
    for name, tag in (
        ("pre", "PREIN"),
        ("post", "POSTIN"),
        ("preun", "PREUN"),
        ("postun", "POSTUN"),
    ):
        assert rpm_query(rpm, "--qf", f"%{{{tag}PROG}}") == "/bin/sh"
        (folder / name).write_text("#!/bin/sh\n" + rpm_query(rpm, "--qf", f"%{{{tag}}}"))
        (folder / name).chmod(0o755)
    return folder


def run_scripts(scripts: Path, tmp_path: Path, steps: list[tuple[str, ...]]) -> tuple[str, dict]:
    """Run maintainer scripts (or scriptlets) in `scripts` as dpkg or rpm would, in a private
    mount namespace where /etc, /var/lib and /run are overlays (writes land in tmp_path) and
    the system tools they call are logging stubs. Each step must exit 0. Returns the log and
    which product paths exist after."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    log = tmp_path / "log"
    log.touch()
    mounts = []
    for target in ("/etc", "/var/lib", "/run"):
        upper, work = tmp_path / f"up{target}", tmp_path / f"work{target}"
        upper.mkdir(parents=True)
        work.mkdir(parents=True)
        mounts.append(
            f"mount -t overlay xh -o lowerdir={target},upperdir={upper},workdir={work} {target}"
        )
    # As the package's files would be after unpacking, and systemd as PID 1.
    setup = "mkdir -p /etc/xhagent/policies.d /var/lib/xhagent /run/systemd/system"
    setup += " && echo '# conf' > /etc/xhagent/agent.yaml && touch /var/lib/xhagent/state.db"
    calls = [
        f'echo "== {" ".join(step)}" >> "$XH_LOG"; {scripts}/{" ".join(step)}' for step in steps
    ]
    check = (
        "for p in /etc/xhagent /var/lib/xhagent/state.db; do if [ -e $p ]; then echo $p; fi; done"
    )
    script = " && ".join([*mounts, setup, *calls, check])
    res = sh(
        "unshare", "--mount", "--propagation", "private", "sh", "-c", script,
        env={"PATH": f"{stubs}:/usr/sbin:/usr/bin:/sbin:/bin", "XH_LOG": str(log)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return log.read_text(), set(res.stdout.split())


def section(log: str, step: str) -> str:
    return log.split(f"== {step}\n", 1)[1].split("== ", 1)[0]


def test_install_creates_the_group_enables_and_starts(packages, tmp_path):
    scripts = deb_scripts(packages[0], tmp_path)
    log, left = run_scripts(scripts, tmp_path, [("postinst", "configure")])
    out = section(log, "postinst configure")
    assert "addgroup --system --quiet xhagent" in out
    assert "deb-systemd-helper enable xhagent.service" in out
    assert "deb-systemd-helper enable xhagent-workloads.service" in out
    assert "systemctl --system daemon-reload" in out
    # The workloads' unit first: the agent orders after it and uses its cgroup.
    assert out.index("deb-systemd-invoke start xhagent-workloads.service") < out.index(
        "deb-systemd-invoke start xhagent.service"
    )
    assert "stop" not in out and "restart" not in out


def test_upgrade_restarts_without_a_stop(packages, tmp_path):
    # dpkg's order for an upgrade: old prerm upgrade, new postinst configure OLD-VERSION.
    scripts = deb_scripts(packages[0], tmp_path)
    steps = [("prerm", "upgrade", VERSION), ("postinst", "configure", "0.0.1")]
    log, left = run_scripts(scripts, tmp_path, steps)
    # No stop: KillMode=process lets the restart keep the workloads, and the new agent
    # re-adopts them.
    assert "deb-systemd-invoke" not in section(log, f"prerm upgrade {VERSION}")
    out = section(log, "postinst configure 0.0.1")
    assert "deb-systemd-invoke restart xhagent.service" in out
    assert "deb-systemd-invoke stop" not in out
    # The workloads' unit is started when it is not running (an upgrade from a build that
    # had none), never restarted: its cgroup holds the running workloads.
    assert "deb-systemd-invoke start xhagent-workloads.service" in out
    assert "restart xhagent-workloads" not in out


def test_remove_stops_and_keeps_state_purge_deletes_it(packages, tmp_path):
    scripts = deb_scripts(packages[0], tmp_path)
    log, left = run_scripts(scripts, tmp_path, [("prerm", "remove"), ("postrm", "remove")])
    stop = "deb-systemd-invoke stop xhagent.service xhagent-workloads.service"
    assert stop in section(log, "prerm remove")
    assert left == {"/etc/xhagent", "/var/lib/xhagent/state.db"}
    steps = [("prerm", "remove"), ("postrm", "remove"), ("postrm", "purge")]
    log, left = run_scripts(scripts, tmp_path / "purge", steps)
    assert left == set()
    assert "deb-systemd-helper purge xhagent.service" in section(log, "postrm purge")
    assert "deb-systemd-helper purge xhagent-workloads.service" in section(log, "postrm purge")


def test_rpm_install_creates_the_group_and_applies_presets(packages, tmp_path):
    scripts = rpm_scripts(packages[1], tmp_path)
    log, left = run_scripts(scripts, tmp_path, [("pre", "1"), ("post", "1")])
    assert "groupadd -r xhagent" in section(log, "pre 1")
    out = section(log, "post 1")
    # The RPM way: the distribution's presets decide whether it is enabled and started.
    assert "systemctl --no-reload preset xhagent-workloads.service xhagent.service" in out
    assert "systemctl daemon-reload" in out


def test_rpm_upgrade_restarts_without_a_stop(packages, tmp_path):
    # rpm's order for an upgrade: new %pre 2, new %post 2, old %preun 1, old %postun 1.
    scripts = rpm_scripts(packages[1], tmp_path)
    steps = [("pre", "2"), ("post", "2"), ("preun", "1"), ("postun", "1")]
    log, left = run_scripts(scripts, tmp_path, steps)
    assert "preset" not in section(log, "post 2")
    assert "disable" not in section(log, "preun 1") and "stop" not in section(log, "preun 1")
    assert "systemctl try-restart xhagent.service" in section(log, "postun 1")
    assert "workloads" not in section(log, "postun 1")
    assert left == {"/etc/xhagent", "/var/lib/xhagent/state.db"}


def test_rpm_erase_stops_and_keeps_state(packages, tmp_path):
    scripts = rpm_scripts(packages[1], tmp_path)
    log, left = run_scripts(scripts, tmp_path, [("preun", "0"), ("postun", "0")])
    erase = "systemctl --no-reload disable --now xhagent.service xhagent-workloads.service"
    assert erase in section(log, "preun 0")
    assert "restart" not in section(log, "postun 0")
    # rpm itself removes only the package's files: the task records stay.
    assert "/var/lib/xhagent/state.db" in left


# -- the .deb through dpkg itself ---------------------------------------------------------------
DPKG_CYCLE = r"""
set -e
for d in etc var usr opt run; do
  mkdir -p "$SCRATCH/up/$d" "$SCRATCH/work/$d"
  mount -t overlay xh -o "lowerdir=/$d,upperdir=$SCRATCH/up/$d,workdir=$SCRATCH/work/$d" "/$d"
done
# An empty /run: no systemd as PID 1 here, so the scripts must not try to start anything.
mount -t tmpfs xh /run
step() { echo "== $1"; }
step install
dpkg -i "$DEB" >/dev/null
getent group xhagent
readlink /etc/systemd/system/multi-user.target.wants/xhagent.service
readlink /etc/systemd/system/multi-user.target.wants/xhagent-workloads.service
xhagent version | head -1
find /opt/xhagent -name '*.pyc' | head -1
echo "task record" > /var/lib/xhagent/state.db
step reinstall
dpkg -i "$DEB" >/dev/null
dpkg-query -W -f='${Status}\n' xhagent
step remove
dpkg -r xhagent >/dev/null 2>&1
ls -d /etc/xhagent/agent.yaml /var/lib/xhagent/state.db /opt/xhagent /usr/bin/xhagent 2>&1 || true
step purge
dpkg -P xhagent >/dev/null 2>&1
ls -d /etc/xhagent /var/lib/xhagent 2>&1 || true
"""


def test_deb_installs_reinstalls_removes_and_purges_with_dpkg(packages, tmp_path):
    """Real dpkg, real maintainer scripts, real addgroup and deb-systemd-helper: the host's
    /etc, /var, /usr, /opt are overlays in a private mount namespace (every write lands in
    tmp_path), so the package's Depends are this Debian 12 host's own packages."""
    res = sh(
        "unshare", "--mount", "--propagation", "private", "sh", "-c", DPKG_CYCLE,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEB": str(packages[0]),
             "SCRATCH": str(tmp_path), "LC_ALL": "C.UTF-8"},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    steps = dict(part.split("\n", 1) for part in res.stdout.split("== ")[1:])
    install = steps["install"].splitlines()
    assert install[0].startswith("xhagent:x:")  # the system group
    assert install[1] == "/lib/systemd/system/xhagent.service"  # enabled
    assert install[2] == "/lib/systemd/system/xhagent-workloads.service"  # enabled too
    assert install[3] == f"xhagent {VERSION}"  # /usr/bin/xhagent runs, as installed
    assert install[4].startswith("/opt/xhagent/lib/python3.11/") and install[4].endswith(".pyc")
    assert steps["reinstall"].strip() == "install ok installed"
    # remove: the conffile and the task records stay; the program, bytecode included, goes.
    removed = steps["remove"]
    assert "/etc/xhagent/agent.yaml\n" in removed and "/var/lib/xhagent/state.db\n" in removed
    assert "cannot access '/opt/xhagent'" in removed
    assert "cannot access '/usr/bin/xhagent'" in removed
    purged = steps["purge"]
    assert "cannot access '/etc/xhagent'" in purged
    assert "cannot access '/var/lib/xhagent'" in purged
    # And the host saw none of it.
    assert not Path("/opt/xhagent").exists() and not Path("/etc/xhagent").exists()
