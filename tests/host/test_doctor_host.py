"""`xhagent doctor --json` on this host agrees with what the kernel says by other means."""

import ctypes.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xhagent.cgroups import Cgroup
from xhagent.cgroups.mounts import discover_hierarchy

pytestmark = pytest.mark.host

XHAGENT = Path(sys.executable).with_name("xhagent")


@pytest.fixture(scope="module")
def report(doctor_report):
    return doctor_report


def test_kernel_and_privileges(report):
    assert report["kernel"]["release"] == os.uname().release
    assert report["capabilities"]["euid"] == 0


def test_the_report_holds_exactly_the_items_completion_offers(report):
    from xhagent.doctor import item_names

    assert list(report) == item_names()


def test_io_uring_items(report):
    for name in (
        "io_uring",
        "io_uring.sqpoll",
        "io_uring.registered_buffers",
        "io_uring.registered_files",
        "io_uring.o_direct",
        "io_uring.ops",
    ):
        assert report[name]["ok"], (name, report[name])
    assert {"READ", "WRITE", "OPENAT", "CLOSE", "STATX", "READ_FIXED"} <= set(
        report["io_uring.ops"]["ops"]
    )


def test_iopoll_reported_per_device_with_sysfs_value(report):
    blocks = [p for p in Path("/sys/block").iterdir() if int((p / "size").read_text()) > 0]
    assert blocks
    for dev in blocks:
        item = report[f"iopoll.{dev.name}"]
        io_poll = int((dev / "queue/io_poll").read_text())
        assert item["io_poll"] == io_poll
        assert item["dev"] == (dev / "dev").read_text().strip()
        if io_poll == 0:
            assert not item["ok"] and "queue/io_poll=0" in item["reason"]
    if not any(report[f"iopoll.{d.name}"]["ok"] for d in blocks):
        assert not report["iopoll"]["ok"]
        assert all(d.name in report["iopoll"]["reason"] for d in blocks)


def test_polled_read_of_a_regular_file_is_refused(report):
    # IORING_SETUP_IOPOLL needs a block device whose driver polls; filesystems refuse it.
    assert not report["iopoll.file"]["ok"]
    assert "-EOPNOTSUPP" in report["iopoll.file"]["reason"]


def test_cgroup_items_match_mountinfo(report):
    hier = discover_hierarchy()
    assert report["cgroup.mode"]["mode"] == hier.mode
    assert report["cgroup.mode"]["cgroup2"] == hier.unified.path
    controllers = Path(hier.unified.path, "cgroup.controllers").read_text().split()
    assert report["cgroup.controllers"]["ok"] == {"cpu", "cpuset", "io", "memory", "pids"}.issubset(
        controllers
    )
    if not report["cgroup.controllers"]["ok"]:
        assert report["cgroup.controllers"]["available"] == controllers
    for name in ("cgroup.create", "cgroup.spawn", "cgroup.freeze", "cgroup.kill"):
        assert report[name]["ok"], (name, report[name])
    # 6.18 creates the sleep inside the probe group (clone3 CLONE_INTO_CGROUP) and gives a pidfd
    assert report["cgroup.spawn"]["method"] == "clone3" and report["cgroup.spawn"]["pidfd"] is True
    assert "fallback_because" not in report["cgroup.spawn"]
    assert report["cgroup.kill"]["exit_signal"] == 9
    # The probe leaves nothing behind.
    assert not Path(report["cgroup.create"]["path"]).exists()


def test_ebpf_items(report):
    for name in (
        "ebpf.btf",
        "ebpf.tp_btf_sched_switch",
        "ebpf.ringbuf",
        "ebpf.send_signal_thread",
        "ebpf.sched_trace",
        "ebpf.runqlat",
    ):
        assert report[name]["ok"], (name, report[name])
    assert report["ebpf.tp_btf_sched_switch"]["events"] > 0
    # this kernel gives kernel and user stacks: the doctor's own switch-out came back with
    # frames (of the user stack, at least the C library's where it entered the kernel)
    assert report["ebpf.sched_trace"]["stacks"] == ["kernel", "user"]
    assert report["ebpf.sched_trace"]["kernel_stack_frames"] >= 3
    assert report["ebpf.sched_trace"]["user_stack_frames"] >= 1


def test_nvml_reports_its_own_error_without_a_driver(report):
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("an NVIDIA driver (libnvidia-ml) is installed: covered by the gpu tests")
    assert not report["nvml"]["ok"]
    assert report["nvml"]["reason"].startswith("NVMLError_LibraryNotFound")


def test_require_exit_code_names_the_item(report, run_xhagent):
    want = "io_uring" if report["io_uring"]["ok"] else "kernel"
    assert run_xhagent("doctor", "--require", want).returncode == 0
    lacking = next(n for n, v in report.items() if not v["ok"])
    res = run_xhagent("doctor", "--require", lacking)
    assert res.returncode == 1 and repr(lacking) in res.stderr


def _dead_pid():
    """A pid that no process has now (a child that has been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_killed_doctors_group_is_removed_by_the_next_run_and_nothing_else(run_xhagent):
    parent = Path(discover_hierarchy().unified.path) / "xhagent.slice"
    made = not parent.exists()
    parent.mkdir(exist_ok=True)
    stale = Cgroup(parent / f"doctor-{_dead_pid()}").create()
    sleeper = subprocess.Popen(["sleep", "60"])
    kept = [
        Cgroup(parent / name).create()
        for name in (
            f"doctor-{os.getpid()}",
            "doctor-x",
            "doctor-0",
            "doctor-9999999999",
            "doctor-01",
        )
    ]
    try:
        stale.add_proc(sleeper.pid)
        stale.freeze()  # as a SIGKILL during the freeze probe leaves it
        res = run_xhagent("doctor", "--json")
        assert res.returncode == 0, res.stderr
        create = json.loads(res.stdout)["items"]["cgroup.create"]
        assert create["stale_removed"] == [stale.path.name]
        assert not stale.path.exists()
        assert sleeper.wait(timeout=5) == -9
        assert all(k.path.is_dir() for k in kept)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        for cg in [stale, *kept]:
            if cg.path.exists():
                cg.write("cgroup.freeze", "0")
                cg.remove(kill_first=True)
        if made:
            try:
                parent.rmdir()
            except OSError:
                pass  # a doctor running meanwhile uses it; the last one removes it


# `xhagent doctor` with only the cgroup probe: the seconds the others take are not needed here.
CGROUP_DOCTOR = (
    "import sys\nimport xhagent.doctor as d\nfrom xhagent.doctor import cgroup_probe\n"
    "d._probes = lambda subtree=None: [('cgroup', cgroup_probe.probe)]\n"
    "from xhagent.cli import main\n"
    "sys.argv = ['xhagent', 'doctor']\nmain()\n"
)


def test_a_doctor_stopped_mid_probe_leaves_no_group_and_no_sleep():
    parent = Path(discover_hierarchy().unified.path) / "xhagent.slice"
    for delay in (0.0, 0.002, 0.005, 0.01):
        proc = subprocess.Popen(
            [sys.executable, "-c", CGROUP_DOCTOR],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        group = parent / f"doctor-{proc.pid}"
        deadline = time.monotonic() + 60
        while not group.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(delay)
        members = Cgroup(group).procs() if group.exists() else []
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=15)[
            1
        ]  # a sleep left running would hold stderr open for 30 s
        assert "Traceback" not in err, err
        # 143: stopped inside the probe; 0 or -SIGTERM: the probe had ended and the doctor
        # was on its way out (its handlers already given back) when the signal came
        assert proc.returncode in (0, 128 + signal.SIGTERM, -signal.SIGTERM), err
        assert not group.exists()
        for pid in members:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def test_the_probe_uses_the_place_locate_finds_and_says_so(monkeypatch):
    from xhagent.cgroups.delegation import DelegationError, Placement
    from xhagent.cgroups.subtree import Subtree
    from xhagent.doctor import cgroup_probe

    mount = Path(discover_hierarchy().unified.path)
    rel = f"xhagent-doctor-test-{os.getpid()}.slice"
    placement = Placement(rel, "option", "given by the test")
    monkeypatch.setattr(cgroup_probe, "locate", lambda *a, **k: Subtree(mount, rel, placement))
    items = {i.name: i for i in cgroup_probe.probe()}
    create = items["cgroup.create"]
    assert create.ok, create
    assert create.detail["where"] == str(mount / rel) and create.detail["how"] == "option"
    assert create.detail["path"] == str(mount / rel / f"doctor-{os.getpid()}")
    assert items["cgroup.kill"].ok
    assert not (mount / rel).exists()  # made for the probe, removed after it

    def refused(*a, **k):
        raise DelegationError("systemd manages the cgroup2 tree and delegated none of it")

    monkeypatch.setattr(cgroup_probe, "locate", refused)
    items = {i.name: i for i in cgroup_probe.probe()}
    for name in cgroup_probe.LIFECYCLE:
        assert not items[name].ok
        assert "no place the agent may write: systemd manages" in items[name].reason


def test_preempt_item_here_is_bpf_and_the_timer_works_too(report):
    item = report["runtime.preempt"]
    assert item["ok"] and item["source"] == "bpf", item
    # each source signalled after about a slice of this thread's CPU time
    for key in ("bpf_signal_ms", "timer_signal_ms"):
        assert item["slice_ms"] * 0.9 <= item[key] <= item["slice_ms"] * 3, item


def test_taskstats_items_read_this_process_and_the_sysctl(report):
    assert report["taskstats"]["ok"] and report["taskstats"]["version"] >= 8, report["taskstats"]
    item = report["taskstats.delayacct"]
    state = {"1": "on", "0": "off"}[Path("/proc/sys/kernel/task_delayacct").read_text().strip()]
    assert item["ok"] and item["state"] == state and item["can_enable"], item


WITHOUT_BPF = (
    "import json\nfrom xhagent.doctor import runtime_probe\n"
    "from xhagent.runtime.pool import Pool\n"
    "item = runtime_probe.probe()[0]\n"
    "with Pool([0]) as pool:\n"
    "    workers = pool.stats()['workers']\n"
    "print(json.dumps({'ok': item.ok, **item.detail, 'pool': workers[0]['preempt']}))\n"
)


def test_without_bpf_privileges_the_doctor_and_the_pool_both_say_timer():
    # root without CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN: the BPF object cannot load
    caps = "-bpf,-perfmon,-sys_admin"
    res = subprocess.run(
        ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", sys.executable, "-c"]
        + [WITHOUT_BPF],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["ok"] and got["source"] == "timer" and got["pool"] == "timer", got
    assert got["because"].startswith("the BPF preempter does not load: ")
    assert "-EPERM" in got["because"] and "timer signalled after" in got["because"]
    assert got["bpf_signal_ms"] is None and got["timer_signal_ms"] > 0


def test_subtree_names_where_the_cgroup_probe_writes_and_bad_paths_are_refused(run_xhagent):
    name = f"xhagent-doctor-test-{os.getpid()}.slice"
    where = Path(discover_hierarchy().unified.path) / name
    res = run_xhagent("doctor", "--json", "--subtree", name)
    items = json.loads(res.stdout)["items"]
    assert items["cgroup.create"]["ok"], items["cgroup.create"]
    assert items["cgroup.create"]["where"] == str(where)
    assert items["cgroup.create"]["how"] == "option"
    assert not where.exists()  # the probe made it, and took it away again

    bad = run_xhagent("doctor", "--subtree", "../escape")
    assert bad.returncode == 2 and "'--subtree'" in bad.stderr and "Traceback" not in bad.stderr
