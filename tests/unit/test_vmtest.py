"""The pure logic of tools/vmtest (option parsing, the guest's status, pytest's summary)
and the disk pattern the kernel tests compare against. Booting is tools/vmtest's own
end-to-end check."""

import hashlib
import json
from pathlib import Path

import pytest
from tool_scripts import ROOT, load_script

vmtest = load_script("xhagent_tools_vmtest", ROOT / "tools" / "vmtest")
pattern = load_script("xhagent_tests_pattern", ROOT / "tests" / "kernel" / "pattern.py")


def test_defaults_run_the_kernel_suite():
    args = vmtest.parse_args([])
    assert (args.memory, args.cpus, args.timeout) == ("2G", 2, 1800.0)
    assert args.command == [
        ".venv/bin/python",
        "-m",
        "pytest",
        "-m",
        "kernel",
        "-p",
        "no:cacheprovider",
        "tests/kernel",
    ]
    assert args.guest is None


def test_command_after_double_dash_is_kept_verbatim():
    args = vmtest.parse_args(
        [
            "--memory",
            "512M",
            "--cpus",
            "1",
            "--timeout",
            "30",
            "--",
            "sh",
            "-c",
            "exit 7",
            "--",
            "--memory",
        ]
    )
    assert (args.memory, args.cpus, args.timeout) == ("512M", 1, 30.0)
    assert args.command == ["sh", "-c", "exit 7", "--", "--memory"]


def test_default_command_is_a_fresh_list():
    vmtest.parse_args([]).command.append("x")
    assert vmtest.parse_args([]).command == vmtest.DEFAULT_COMMAND


@pytest.mark.parametrize(
    "argv",
    [
        ["--"],
        ["--memory", "lots"],
        ["--memory", "2T"],
        ["--cpus", "0"],
        ["--cpus", "two"],
        ["--timeout", "-1"],
        ["true"],
    ],
)
def test_bad_invocations_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        vmtest.parse_args(argv)
    assert stop.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize("returncode, code", [(0, 0), (1, 1), (7, 7), (-9, 137), (-15, 143)])
def test_exit_code_follows_the_shell(returncode, code):
    assert vmtest.exit_code(returncode) == code


@pytest.mark.parametrize("code", [0, 1, 7, 255])
def test_status_of_the_command(code):
    assert vmtest.parse_status(json.dumps({"stage": "command", "returncode": code})) == code


def test_setup_failure_is_a_harness_error():
    text = json.dumps({"stage": "setup", "error": "/dev/nvme0n1 did not appear within 30s"})
    with pytest.raises(vmtest.HarnessError, match="guest setup failed: /dev/nvme0n1"):
        vmtest.parse_status(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "7",
        "[]",
        "{not json",
        json.dumps({"stage": "command"}),
        json.dumps({"stage": "command", "returncode": "7"}),
        json.dumps({"stage": "command", "returncode": 256}),
        json.dumps({"stage": "other", "returncode": 0}),
    ],
)
def test_unreadable_status_is_a_harness_error(text):
    with pytest.raises(vmtest.HarnessError, match="unreadable guest status"):
        vmtest.parse_status(text)


@pytest.mark.parametrize(
    "line, summary",
    [
        (
            "============================== 8 passed in 0.91s ===============================\n",
            "8 passed in 0.91s",
        ),
        (
            "===== 1 failed, 3 passed, 2 skipped in 12.34s =====\r\n",
            "1 failed, 3 passed, 2 skipped in 12.34s",
        ),
        (
            "\x1b[32m======= \x1b[32m\x1b[1m5 passed\x1b[0m"
            "\x1b[32m in 3s\x1b[0m\x1b[32m =======\x1b[0m\n",
            "5 passed in 3s",
        ),
        (
            "============================ no tests ran in 0.01s =============================",
            "no tests ran in 0.01s",
        ),
        ("=========================== short test summary info ============================", None),
        ("============================= test session starts ==============================", None),
        ("8 passed in 0.91s", None),
    ],
)
def test_summary_line(line, summary):
    assert vmtest.summary_line(line) == summary


def test_vng_command_line(tmp_path):
    args = vmtest.parse_args(["--memory", "1G", "--cpus", "3", "--", "true"])
    cmd = vmtest.vng_command(Path("/v/vng"), Path("/k/boot/vmlinuz-6.1.0-57-amd64"), tmp_path, args)
    assert cmd[:3] == ["/v/vng", "--run", "/k/boot/vmlinuz-6.1.0-57-amd64"]
    for flag in (
        ["--disable-kvm"],
        ["--force-9p"],
        ["--memory", "1G"],
        ["--cpus", "3"],
        ["--append", "cgroup_no_v1=all"],
        ["--append", "nvme.poll_queues=1"],
        ["--append", "softlockup_panic=1"],
        ["--rwdir", str(tmp_path)],
    ):
        assert any(cmd[i : i + len(flag)] == flag for i in range(len(cmd))), flag
    qemu = [a for a in cmd if a.startswith("--qemu-opts=")]
    assert len(qemu) == 1
    assert f"file={tmp_path / 'nvme.img'}" in qemu[0] and "-device nvme," in qemu[0]
    # emulated: every vCPU on one thread (see TCG)
    assert qemu[0].startswith("--qemu-opts=-accel tcg,thread=single ")
    # the monitor a timed-out run's vCPUs are described from
    assert qemu[0].endswith(f" -monitor unix:{tmp_path / 'monitor.sock'},server=on,wait=off")
    assert "--verbose" not in cmd
    args = vmtest.parse_args(["--console", "--", "true"])
    assert "--verbose" in vmtest.vng_command(Path("/v/vng"), Path("/k/vmlinuz"), tmp_path, args)
    assert cmd[-2] == "--exec" and cmd[-1].endswith(f"--guest {tmp_path}")


def test_pattern_is_pinned():
    data = pattern.pattern()
    assert len(data) == pattern.SIZE
    assert data.startswith(b"XHAGENT-VMTEST\n")
    assert hashlib.sha256(data).hexdigest() == pattern.SHA256


def test_pattern_expected_reads(tmp_path):
    image = tmp_path / "nvme.img"
    pattern.write_image(image)
    assert image.stat().st_size == pattern.DISK_SIZE
    with image.open("rb") as disk:
        for offset, length in [
            (0, 4096),
            (4096, 8192),
            (pattern.SIZE - 100, 4096),
            (pattern.DISK_SIZE - 4096, 4096),
        ]:
            disk.seek(offset)
            assert disk.read(length) == pattern.expected(offset, length), (offset, length)


def test_pattern_rejects_reads_past_the_disk():
    with pytest.raises(ValueError):
        pattern.expected(pattern.DISK_SIZE - 10, 20)


def test_kvm_only_with_hardware_virtualisation(tmp_path, monkeypatch):
    monkeypatch.setattr(vmtest.os, "access", lambda path, mode: True)
    (tmp_path / "kvm").mkdir()
    (tmp_path / "kvm_pvm").mkdir()
    assert not vmtest.hardware_kvm(tmp_path)  # PVM: stock kernels do not boot on it
    (tmp_path / "kvm_intel").mkdir()
    assert vmtest.hardware_kvm(tmp_path)
    args = vmtest.parse_args(["--", "true"])
    cmd = vmtest.vng_command(Path("/v/vng"), Path("/k/vmlinuz"), tmp_path, args, kvm=True)
    assert "--disable-kvm" not in cmd and not any("-accel" in a for a in cmd)
    monkeypatch.setattr(vmtest.os, "access", lambda path, mode: False)
    assert not vmtest.hardware_kvm(tmp_path)


def test_no_monitor_where_its_socket_path_would_be_too_long(tmp_path):
    deep = tmp_path / ("d" * 120)
    assert vmtest.monitor_path(deep) is None and vmtest.monitor_opts(None) == []
    args = vmtest.parse_args(["--", "true"])
    cmd = vmtest.vng_command(Path("/v/vng"), Path("/k/vmlinuz"), deep, args)
    assert "-monitor" not in next(a for a in cmd if a.startswith("--qemu-opts="))
    assert vmtest.monitor_path(tmp_path) == tmp_path / "monitor.sock"


def test_the_guest_saves_its_text_symbols_for_the_host(tmp_path):
    kallsyms = tmp_path / "proc-kallsyms"
    kallsyms.write_text(
        "ffffffff81000000 T _stext\n"
        "ffffffff82000000 D jiffies\n"
        "ffffffffc0a01000 t null_handle_cmd\t[null_blk]\n"
        "ffffffff81a2b3a0 W weak_fn\n"
    )
    vmtest.save_text_symbols(tmp_path, kallsyms)
    saved = (tmp_path / vmtest.KALLSYMS_FILE).read_text().splitlines()
    assert saved == [
        "ffffffff81000000 T _stext",
        "ffffffffc0a01000 t null_handle_cmd\t[null_blk]",
        "ffffffff81a2b3a0 W weak_fn",
    ]
    vmtest.save_text_symbols(tmp_path / "absent-dir", kallsyms)  # said, not raised
