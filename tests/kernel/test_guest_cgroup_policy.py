"""CgroupPolicy files applied by `xhagent cgroup` to the guest kernel's full cgroup2 tree,
read back with plain file reads, and the processes inside observed from /proc."""

import errno
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from xhagent.cgroups import Cgroup, CgroupError

pytestmark = pytest.mark.kernel
XHAGENT = Path(sys.executable).with_name("xhagent")

HEAD = (
    "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {name: guest}\nspec:\n  groups:\n"
)
FULL = (
    HEAD
    + """\
    - name: latency-critical
      io: {weight: 500, devices: {nvme0n1: 800}}
      cpu: {weight: 400, max: "50000 100000", max.burst: 10000}
      cpuset: {cpus: "0-1", mems: "0"}
      memory: {high: 3Gi, max: 4Gi}
      children:
        - name: web
          memory: {max: 1Gi}
    - name: batch
      io: {weight: 100}
      pids: {max: 4096}
"""
)


@pytest.fixture
def node(cgroup_root, nvme_device, tmp_path, run_xhagent):
    """A throwaway subtree and the CLI bound to it; the root's controllers and io.cost
    are put back as they were."""
    name = f"xhagent-test-{uuid.uuid4().hex[:8]}.slice"
    control = cgroup_root / "cgroup.subtree_control"
    had = set(control.read_text().split())
    qos_before = (cgroup_root / "io.cost.qos").read_text()
    majmin = (Path("/sys/block") / nvme_device.name / "dev").read_text().strip()

    def cli(*args, policy=None):
        files = []
        if policy is not None:
            path = tmp_path / f"policy-{uuid.uuid4().hex[:6]}.yaml"
            path.write_text(policy)
            files = ["-f", str(path)]
        return run_xhagent("cgroup", "--subtree", name, *args, *files)

    cli.root, cli.majmin = cgroup_root / name, majmin
    yield cli
    if cli.root.exists():
        for path in sorted(
            (p for p in cli.root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
        ) + [cli.root]:
            Cgroup(path).remove(kill_first=True, timeout=20)
    if f"{majmin} enable=1" not in qos_before:
        (cgroup_root / "io.cost.qos").write_text(f"{majmin} enable=0")
    for c in set(control.read_text().split()) - had:
        control.write_text(f"-{c}")


def lines(path):
    return Path(path).read_text().splitlines()


def applied(res):
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


def test_full_policy_applied_read_back_and_idempotent(node):
    out = applied(node("apply", "--own-root", "--enable-io-cost", "--json", policy=FULL))
    assert out["enforcers"][node.majmin]["enforcer"] == "io.cost"
    kinds = [a["kind"] for a in out["apply"]["applied"]]
    assert kinds.index("io-cost") < kinds.index("write")
    lc = node.root / "latency-critical"
    assert lines(lc / "io.weight") == ["default 500", f"{node.majmin} 800"]
    assert lines(lc / "cpu.weight") == ["400"] and lines(lc / "cpu.max") == ["50000 100000"]
    assert lines(lc / "cpu.max.burst") == ["10000"]
    assert lines(lc / "cpuset.cpus") == ["0-1"] and lines(lc / "cpuset.mems") == ["0"]
    assert lines(lc / "memory.high") == [str(3 << 30)] and lines(lc / "memory.max") == [
        str(4 << 30)
    ]
    assert lines(lc / "web/memory.max") == [str(1 << 30)]
    assert lines(node.root / "batch/pids.max") == ["4096"]
    assert lines(node.root / "batch/io.weight")[0] == "default 100"

    again = applied(node("apply", "--own-root", "--enable-io-cost", "--json", policy=FULL))
    assert again["apply"]["applied"] == [] and again["actions"] == []

    (lc / "memory.max").write_text("max")  # drift made behind the agent's back
    plan = applied(node("plan", "--own-root", "--enable-io-cost", "--json", policy=FULL))
    assert [(d["group"], d["file"], d["old"], d["value"]) for d in plan["drift"]] == [
        ("latency-critical", "memory.max", "max", 4 << 30)
    ]


def test_process_pinned_by_cpuset(node):
    applied(
        node(
            "apply",
            "--own-root",
            "--json",
            policy=HEAD + "    - name: pin\n      cpuset: {cpus: '1'}\n",
        )
    )
    res = node("run", "pin", "--", "grep", "Cpus_allowed_list", "/proc/self/status")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["Cpus_allowed_list:", "1"]


def test_memory_max_kills_inside_the_group_and_show_reports_it(node):
    applied(
        node(
            "apply",
            "--own-root",
            "--json",
            policy=HEAD + "    - name: small\n      memory: {max: 32Mi, swap.max: 0}\n",
        )
    )
    res = node(
        "run",
        "small",
        "--",
        sys.executable,
        "-c",
        "x = bytearray(256 << 20); x[::4096] = b'x' * (64 << 10)",
    )
    assert res.returncode == 128 + 9, (res.returncode, res.stderr)
    events = dict(line.split() for line in lines(node.root / "small/memory.events"))
    assert int(events["oom_kill"]) >= 1
    shown = json.loads(node("show", "small", "--json").stdout)["groups"]["small"]
    assert shown["stats"]["memory.events"]["oom_kill"] >= 1
    assert shown["values"]["memory.max"] == 32 << 20


def test_processes_moved_into_a_leaf_before_a_domain_controller(node):
    applied(node("apply", "--own-root", "--json", policy=HEAD + "    - name: outer\n"))
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        (node.root / "outer/cgroup.procs").write_text(str(sleeper.pid))
        policy = HEAD + "    - name: outer\n      children: [{name: inner, memory: {max: 64Mi}}]\n"
        out = applied(node("apply", "--own-root", "--json", policy=policy))
        kinds = [(a["kind"], a["group"]) for a in out["apply"]["applied"]]
        assert kinds.index(("move-procs", "outer")) < kinds.index(("enable", "outer"))
        assert Path(f"/proc/{sleeper.pid}/cgroup").read_text().strip().endswith("/outer/leaf")
        assert "memory" in (node.root / "outer/cgroup.subtree_control").read_text().split()
        assert lines(node.root / "outer/inner/memory.max") == [str(64 << 20)]
    finally:
        sleeper.kill()
        sleeper.wait()


def _state(pid):
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_freeze_timeout_thaws_back(node, nvme_device):
    # A reader held in uninterruptible sleep by io.max cannot reach the freezer, so the
    # group never reports frozen 1: the freeze must time out and leave the group thawed.
    policy = HEAD + "    - name: stuck\n      io: {max: {nvme0n1: {rbps: 4096}}}\n"
    applied(node("apply", "--own-root", "--json", policy=policy))
    group = Cgroup(node.root / "stuck")
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import mmap, os, sys\nsys.stdin.readline()\nbuf = mmap.mmap(-1, 1 << 20)\n"
                f"fd = os.open('{nvme_device}', os.O_RDONLY | os.O_DIRECT)\n"
                "print('reading', flush=True)\n"
                "while True: os.preadv(fd, [buf], 0)\n"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        group.add_proc(reader.pid)
        reader.stdin.write("go\n")
        reader.stdin.flush()
        assert reader.stdout.readline() == "reading\n"
        # Blocked for good once it stays in D (startup reads over 9p are D too, but brief).
        deadline, steady = time.monotonic() + 30, 0
        while steady < 10:
            steady = steady + 1 if _state(reader.pid) == "D" else 0
            assert time.monotonic() < deadline, (
                f"the throttled reader never blocked: {_state(reader.pid)}"
            )
            time.sleep(0.05)
        with pytest.raises(CgroupError) as info:
            group.freeze(timeout=1.0)
        assert reader.poll() is None
        assert info.value.errno == errno.ETIMEDOUT and "thawed back" in str(info.value)
        assert lines(group.path / "cgroup.freeze") == ["0"] and group.events()["frozen"] == 0
        res = node("freeze", "stuck", "--timeout", "0.5")
        assert res.returncode == 1 and "did not reach frozen 1" in res.stderr
        assert lines(group.path / "cgroup.freeze") == ["0"]
        # SIGTERM while the command waits for a confirmation that cannot come: thawed back.
        proc = subprocess.Popen(
            [
                str(XHAGENT),
                "cgroup",
                "--subtree",
                node.root.name,
                "freeze",
                "stuck",
                "--timeout",
                "60",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while lines(group.path / "cgroup.freeze") != ["1"]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.01)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert (
            "freeze stuck: stopped by SIGTERM" in err
            and "frozen=0" in err
            and "Traceback" not in err
        )
        assert lines(group.path / "cgroup.freeze") == ["0"] and group.events()["frozen"] == 0
        assert reader.poll() is None
    finally:
        (group.path / "io.max").write_text(f"{node.majmin} rbps=max")  # let the read finish
        reader.kill()
        reader.wait(timeout=30)


@pytest.fixture
def bfq(nvme_device):
    """nvme0n1 scheduled by BFQ (Debian builds it as a module: loaded from the unpacked
    guest kernel), put back to its scheduler afterwards."""
    sched = Path("/sys/block") / nvme_device.name / "queue" / "scheduler"
    before = sched.read_text().split("[")[1].split("]")[0]
    if "bfq" not in sched.read_text():
        kernels = sorted(
            (Path(__file__).resolve().parents[2] / ".cache" / "guest-kernel").glob("*/lib/modules")
        )
        assert kernels, "tools/guest-kernel unpacks the kernel's modules under .cache/guest-kernel"
        subprocess.run(["modprobe", "-d", str(kernels[-1].parent.parent), "bfq"], check=True)
    sched.write_text("bfq")
    yield
    sched.write_text(before)


def test_bfq_weight_written_scaled_where_bfq_schedules_the_device(node, bfq):
    policy = (
        HEAD
        + """\
    - name: prio
      io: {weight: 500, devices: {nvme0n1: 800}}
    - name: low
      io: {weight: 50}
"""
    )
    out = applied(node("apply", "--own-root", "--json", policy=policy))
    assert out["enforcers"][node.majmin]["enforcer"] == "bfq"
    # systemd's mapping onto BFQ's 1..1000: 500 -> 100 + 400*900/9900 = 136, 800 -> 163
    assert lines(node.root / "prio" / "io.bfq.weight") == ["default 136", f"{node.majmin} 163"]
    assert lines(node.root / "low" / "io.bfq.weight") == ["default 50"]
    assert lines(node.root / "prio" / "io.weight")[0] == "default 500"
