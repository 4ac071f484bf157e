"""The doctor's pure parts on small fake trees: parsing, classification, report, CLI."""

import errno
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from xhagent import cli
from xhagent.cgroups.mounts import classify, parse_mountinfo
from xhagent.cpulist import parse_cpulist
from xhagent.doctor import render, required_problems, run_probes
from xhagent.doctor.iopoll_probe import block_devices
from xhagent.doctor.report import fail, ok
from xhagent.doctor.system_probe import decode_caps, effective_caps, numa_nodes
from xhagent.errors import errno_reason

# /proc/self/mountinfo lines; the long ones are split before " - " (then fs type, source,
# super options).
HYBRID = (
    "30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
    "31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10"
    " - cgroup2 cgroup2 rw,nsdelegate\n"
    "32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11"
    " - cgroup cgroup rw,xattr,name=systemd\n"
    "33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12"
    " - cgroup cgroup rw,cpu,cpuacct\n"
    "34 30 0:30 / /sys/fs/cgroup/blkio rw,nosuid,nodev,noexec,relatime shared:13"
    " - cgroup cgroup rw,blkio\n"
    "35 22 0:5 / /proc rw,nosuid,nodev,noexec,relatime shared:14 - proc proc rw\n"
)
UNIFIED = (
    "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4"
    " - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
)
LEGACY = "33 30 0:29 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory\n"


def test_cpulist_syntax():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("5") == [5]
    assert parse_cpulist("\n") == []


def test_capabilities_decode_by_bit():
    # CapEff of this project's CI hosts: everything but CAP_SYS_RESOURCE (bit 24).
    mask = effective_caps("Name:\tx\nCapEff:\t000001fffeffffff\n")
    names = decode_caps(mask)
    assert "SYS_RESOURCE" not in names
    assert {"SYS_ADMIN", "BPF", "PERFMON", "CHOWN", "CHECKPOINT_RESTORE"} <= set(names)
    assert decode_caps(1 << 21) == ["SYS_ADMIN"]


def test_numa_nodes_from_fake_sysfs(tmp_path):
    node = tmp_path / "devices/system/node"
    for n, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15")):
        (node / f"node{n}").mkdir(parents=True)
        (node / f"node{n}/cpulist").write_text(cpus + "\n")
    (node / "online").write_text("0-1\n")
    assert numa_nodes(tmp_path) == {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]}
    assert numa_nodes(tmp_path / "nowhere") == {}


def _blockdev(root: Path, name, dev, size, io_poll, lbs=512):
    d = root / "block" / name
    (d / "queue").mkdir(parents=True)
    (d / "dev").write_text(dev + "\n")
    (d / "size").write_text(f"{size}\n")
    (d / "queue/io_poll").write_text(f"{io_poll}\n")
    (d / "queue/logical_block_size").write_text(f"{lbs}\n")


def test_block_devices_skip_empty_and_read_io_poll(tmp_path):
    _blockdev(tmp_path, "loop0", "7:0", 0, 0)
    _blockdev(tmp_path, "nvme0n1", "259:0", 131072, 1, 4096)
    _blockdev(tmp_path, "vda", "254:0", 1 << 29, 0)
    devs = block_devices(tmp_path)
    assert [(d.name, d.dev, d.io_poll, d.logical_block) for d in devs] == [
        ("nvme0n1", "259:0", 1, 4096),
        ("vda", "254:0", 0, 512),
    ]


def test_mountinfo_hybrid():
    mounts = parse_mountinfo(HYBRID)
    assert [m.fstype for m in mounts] == ["cgroup2", "cgroup", "cgroup", "cgroup"]
    hier = classify(mounts)
    assert hier.mode == "hybrid"
    assert hier.unified.path == "/sys/fs/cgroup/unified"
    assert set(hier.v1_controllers) == {"cpu", "cpuacct", "blkio"}  # name=systemd holds none


def test_mountinfo_unified_legacy_none_and_escapes():
    assert classify(parse_mountinfo(UNIFIED)).mode == "unified"
    assert classify(parse_mountinfo(LEGACY)).mode == "legacy"
    assert classify([]).mode == "none"
    line = r"40 30 0:40 / /mnt/my\040cg rw - cgroup2 cgroup2 rw" + "\n"
    assert parse_mountinfo(line)[0].path == "/mnt/my cg"


def test_errno_reason_names_eopnotsupp():
    assert errno_reason(-errno.EOPNOTSUPP) == "-EOPNOTSUPP (Operation not supported)"
    assert (
        errno_reason(OSError(errno.EPERM, "x"), "open /dev/vda")
        == "open /dev/vda: -EPERM (Operation not permitted)"
    )


def test_report_json_shape_and_missing():
    items = [ok("io_uring", entries=8), fail("iopoll", "no device polls", devices=[])]
    doc = json.loads(render.dumps(items))
    assert doc["items"]["io_uring"] == {"ok": True, "entries": 8}
    assert doc["items"]["iopoll"] == {"ok": False, "reason": "no device polls", "devices": []}
    assert doc["missing"] == ["iopoll"] and doc["ok"] == ["io_uring"]
    assert required_problems(items, ["io_uring"]) == (0, [])
    assert required_problems(items, ["io_uring", "iopoll"]) == (
        1,
        ["required item 'iopoll' is not ok: no device polls"],
    )
    table = render.table(items).splitlines()
    assert table[0].split() == ["ITEM", "OK", "DETAIL", "/", "REASON"]
    assert table[1].split()[:2] == ["io_uring", "ok"] and table[2].split()[:2] == ["iopoll", "NO"]


def test_crashing_probe_becomes_failed_item():
    def broken():
        raise ValueError("bad sysfs value")

    items = run_probes([("system", lambda: [ok("kernel")]), ("ebpf", broken)])
    assert items[0].ok
    assert items[1].name == "ebpf" and not items[1].ok
    assert "ValueError: bad sysfs value" in items[1].reason


def test_a_probe_crashing_on_a_missing_file_says_which_without_an_errno_prefix():
    def broken():
        open("/sys/nonexistent/online")

    (item,) = run_probes([("system", broken)])
    assert item.reason.startswith(
        "probe crashed: FileNotFoundError: /sys/nonexistent/online: "
        "-ENOENT (No such file or directory) (test_doctor_parsing.py:"
    )
    assert "[Errno" not in item.reason


@pytest.fixture
def fake_probes(monkeypatch):
    import xhagent.doctor as doctor

    monkeypatch.setattr(
        doctor,
        "_probes",
        lambda subtree=None: [("x", lambda: [ok("io_uring"), fail("iopoll", "io_poll=0")])],
    )


def test_cli_require_exit_codes(fake_probes):
    runner = CliRunner()
    res = runner.invoke(cli.main, ["doctor", "--json", "--require", "io_uring"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["items"]["iopoll"]["reason"] == "io_poll=0"
    res = runner.invoke(cli.main, ["doctor", "--require", "iopoll"])
    assert res.exit_code == 1
    assert "required item 'iopoll' is not ok" in res.stderr
    assert "io_poll=0" in res.stderr  # and why


def test_cli_require_of_an_unknown_item_is_bad_input_and_names_the_items(fake_probes):
    res = CliRunner().invoke(cli.main, ["doctor", "--require", "bogus", "--require", "iopoll"])
    assert res.exit_code == 2
    assert "--require 'bogus': no such item; the items are: io_uring, iopoll" in res.stderr


def test_required_items_of_a_crashed_probe_are_not_ok_rather_than_unknown():
    from xhagent.doctor import required_problems

    items = [ok("io_uring"), fail("ebpf", "probe crashed: OSError: boom (x.py:1)")]
    assert required_problems(items, ["io_uring"]) == (0, [])
    code, problems = required_problems(items, ["ebpf.btf"])
    assert code == 1 and problems == [
        "required item 'ebpf.btf' is not in the report: ebpf: probe crashed: OSError: boom (x.py:1)"
    ]
    assert required_problems([ok("io_uring")], ["ebpf.btf"])[0] == 2


def test_a_stop_during_the_probes_exits_128_plus_n_without_a_traceback(monkeypatch):
    import os
    import signal

    import xhagent.doctor as doctor

    cleaned = []

    def stopped():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            return [ok("io_uring")]
        finally:
            cleaned.append(True)

    monkeypatch.setattr(doctor, "_probes", lambda subtree=None: [("x", stopped)])
    res = CliRunner().invoke(cli.main, ["doctor"])
    assert res.exit_code == 128 + signal.SIGTERM and "stopped by SIGTERM" in res.stderr
    assert cleaned == [True] and "Traceback" not in res.output


def test_errno_reason_is_the_one_format_libbpf_codes_included():
    # The cgroup writer, the BPF loader and the doctor all print an errno this way.
    from xhagent.bpf.loader import format_error
    from xhagent.errors import errno_name

    assert errno_name(-errno.EOPNOTSUPP) == "EOPNOTSUPP" and errno_name(99999) == "99999"
    assert format_error("load", -errno.EPERM) == "load: -EPERM (Operation not permitted)"
    assert format_error("load", -4007).startswith("load: -LIBBPF_ERRNO__VERIFY (")


def test_preempt_item_names_the_pools_source_and_why_not_the_other():
    from xhagent.doctor.runtime_probe import decide

    item = decide((True, 10.1, ""), (11.7, ""))
    assert item.ok and item.detail["source"] == "bpf"
    assert "BPF preempter loads" in item.detail["because"]
    assert "timer is for nodes where BPF does not load" in item.detail["because"]

    no_bpf = "the BPF preempter does not load: load preempt.bpf.o: -EPERM (Operation not permitted)"
    item = decide((False, None, no_bpf), (12.0, ""))
    assert item.ok and item.detail["source"] == "timer"
    assert item.detail["because"].startswith(no_bpf) and item.detail["timer_signal_ms"] == 12.0

    # BPF loads, so the pool picks it: a BPF that never signals is a failure, not a fallback
    item = decide((True, None, "no SIGURG within 1 s (sent=0, failed=3)"), (12.0, ""))
    assert not item.ok and item.detail["source"] == "bpf"
    assert "does not preempt: no SIGURG" in item.reason and "preempt='timer'" in item.reason

    item = decide((False, None, no_bpf), (None, "timer_create(...): -EAGAIN (x)"))
    assert not item.ok and item.detail["source"] == "off"
    assert no_bpf in item.reason and "-EAGAIN" in item.reason


def test_delayacct_item_on_off_refused_absent():
    from xhagent.doctor.taskstats_probe import DELAYACCT_NAME, decide
    from xhagent.metrics.taskstats import DelayAcct

    item = decide(DelayAcct("on"), None)
    assert item.name == DELAYACCT_NAME and item.ok and item.detail["state"] == "on"

    item = decide(DelayAcct("off"), None)
    assert item.ok and item.detail == {
        "state": "off",
        "can_enable": True,
        "because": item.detail["because"],
    }
    assert "tasks started while it is 0 never get block I/O" in item.detail["because"]

    refused = "write 0 to /proc/sys/kernel/task_delayacct: -EPERM (Operation not permitted)"
    item = decide(DelayAcct("off"), refused)
    assert not item.ok and not item.detail["can_enable"]
    assert refused in item.reason and "sysctl kernel.task_delayacct=1" in item.reason

    item = decide(DelayAcct("absent", reason="... without CONFIG_TASK_DELAY_ACCT ..."), None)
    assert not item.ok and item.detail["state"] == "absent"
    assert "CONFIG_TASK_DELAY_ACCT" in item.reason
