"""The pure parts of the boot test's tools: tools/boot-image's mirror and cache key,
tools/vmtest --image's options, qemu command and results disk, and that tools/boot-check
reports exactly the checks the host test asserts. The boot itself is
tests/host/test_boot_image_host.py."""

import json
import subprocess
from pathlib import Path

import pytest
from tool_scripts import ROOT, load_script

vmtest = load_script("xhagent_tools_vmtest_image", ROOT / "tools" / "vmtest")
boot_image = load_script("xhagent_tools_boot_image", ROOT / "tools" / "boot-image")
boot_check = load_script("xhagent_tools_boot_check", ROOT / "tools" / "boot-check")


def test_the_host_test_asserts_every_check_the_guest_runs():
    from tests.host.test_boot_image_host import CHECKS, KNOWN

    assert CHECKS == boot_check.ORDER
    assert set(KNOWN) <= set(CHECKS)
    assert all(callable(getattr(boot_check.Checks, name)) for name in CHECKS)


def test_image_mode_options():
    args = vmtest.parse_args(["--image", "/x", "--results", "/r.json", "--cpus", "1"])
    assert args.image == Path("/x") and args.results == Path("/r.json") and args.cpus == 1


@pytest.mark.parametrize("argv", [["--image", "/x", "--", "true"], ["--results", "/r.json"]])
def test_image_mode_refuses_a_command_and_results_need_an_image(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        vmtest.parse_args(argv)
    assert exc.value.code == 2


def test_the_image_boots_its_own_kernel_with_the_9p_guests_settings(tmp_path):
    args = vmtest.parse_args(["--image", str(tmp_path)])
    cmd = vmtest.qemu_image_command(tmp_path, tmp_path / "run", args)
    append = cmd[cmd.index("-append") + 1].split()
    assert f"root=LABEL={boot_image.LABEL}" in append
    assert set(vmtest.KERNEL_ARGS) <= set(append) and "cgroup_no_v1=all" in append
    assert cmd[cmd.index("-kernel") + 1] == str(tmp_path / "vmlinuz")
    assert cmd[cmd.index("-initrd") + 1] == str(tmp_path / "initrd.img")
    devices = [cmd[i + 1] for i, word in enumerate(cmd) if word == "-device"]
    assert any(d.startswith("nvme,") for d in devices)
    # The check unit in the image writes to the disk vmtest attaches under this serial.
    assert any(f"serial={vmtest.RESULTS_SERIAL}" in d for d in devices)
    assert f"virtio-{vmtest.RESULTS_SERIAL}" in boot_image.CHECK_UNIT_TEXT
    assert "-no-reboot" in cmd and cmd[cmd.index("-accel") + 1] == "tcg,thread=single"
    assert "softlockup_panic=1" in append
    monitor = tmp_path / "run" / "monitor.sock"
    assert cmd[cmd.index("-monitor") + 1] == f"unix:{monitor},server=on,wait=off"


def test_results_are_read_up_to_the_nul():
    doc = {"checks": [{"name": "a", "ok": True, "detail": ""}], "done": True}
    raw = json.dumps(doc).encode() + b"\n\0" + b"\0" * 100 + b"stale bytes"
    assert vmtest.parse_results(raw) == doc


@pytest.mark.parametrize("raw", [b"\0" * 64, b"{not json\0", b'{"checks": 3}\0'])
def test_no_or_broken_results_are_the_harness_failing(raw):
    with pytest.raises(vmtest.HarnessError):
        vmtest.parse_results(raw)


def test_the_mirror_is_the_one_apt_uses(tmp_path):
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert boot_image.apt_mirror([deb822]) == "http://mirror.example/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text("# deb http://old/debian bookworm main\n"
                        "deb [arch=amd64] http://other.example/debian bookworm main\n")  # fmt: skip
    assert boot_image.apt_mirror([tmp_path / "absent", one_line]) == "http://other.example/debian"
    assert boot_image.apt_mirror([]) == boot_image.DEFAULT_MIRROR


def test_a_changed_recipe_is_a_new_cache_entry(monkeypatch):
    key = boot_image.base_key("http://deb.debian.org/debian")
    assert key == boot_image.base_key("http://deb.debian.org/debian")
    assert key != boot_image.base_key("http://mirror.example/debian")
    monkeypatch.setattr(boot_image, "INCLUDE", [*boot_image.INCLUDE, "less"])
    assert key != boot_image.base_key("http://deb.debian.org/debian")
    monkeypatch.setattr(boot_image, "BASE_SETUP_VERSION", boot_image.BASE_SETUP_VERSION + 1)
    assert key != boot_image.base_key("http://deb.debian.org/debian")


def test_the_backports_node_is_a_base_of_its_own():
    mirror = "http://deb.debian.org/debian"
    assert boot_image.base_key(mirror, True) != boot_image.base_key(mirror)
    assert boot_image.flavour(True) != boot_image.flavour(False)
    assert "systemd" in boot_image.BACKPORTS
    assert "DelegateSubgroup=agent.leaf" in boot_image.DELEGATE_SUBGROUP_DROPIN


def exposure(unit: Path) -> float:
    """`systemd-analyze security --offline` of a unit file: the score the booted node shows
    for the installed unit (the boot check `units_hardened` reads it there)."""
    res = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    last = [ln for ln in res.stdout.splitlines() if "Overall exposure level" in ln]
    assert last, res.stdout + res.stderr
    return float(last[-1].split(":")[-1].split()[0])


@pytest.mark.parametrize("unit", ["xhagent.service", "xhagent-workloads.service"])
def test_the_packaged_units_score_what_the_boot_check_asserts(unit, tmp_path):
    path = ROOT / "packaging" / unit
    assert exposure(path) <= boot_check.EXPOSURE[unit]
    # the same unit without its seccomp filter scores worse: the figure tracks the file
    copy = tmp_path / unit
    copy.write_text(
        "".join(ln for ln in path.read_text().splitlines(True) if "SystemCallFilter" not in ln)
    )
    assert exposure(copy) > boot_check.EXPOSURE[unit]
