"""A CgroupPolicy's spec.ioCost applied by `xhagent cgroup apply` to the guest kernel: the
cgroup2 root's io.cost.model and io.cost.qos of a null_blk disk read back as the policy gives
them (the bench's model and QoS), the device's per-device io.weight is enforced by io.cost
without a separate enable, a second apply writes nothing, and without --enable-io-cost the
policy is refused with the root untouched."""

import json
import uuid
from pathlib import Path

import pytest

from xhagent.cgroups import Cgroup, nullb
from xhagent.cgroups.io_weight import io_cost_enabled
from xhagent.cgroups.nullb import NULLB_MODEL, NULLB_QOS

pytestmark = pytest.mark.kernel

POLICY = """\
apiVersion: xh.scheduling/v1
kind: CgroupPolicy
metadata: {{name: guest-io-cost}}
spec:
  ioCost:
    {disk}:
      model: {{ctrl: user, model: linear, rbps: 16000000, rseqiops: 4000, rrandiops: 4000,
              wbps: 80000000, wseqiops: 20000, wrandiops: 20000}}
      qos: {{enable: 1, ctrl: user, rpct: 95, rlat: 5000, wpct: 95, wlat: 5000, min: 100, max: 100}}
  groups:
    - name: heavy
      io: {{weight: 500, devices: {{{disk}: 800}}}}
"""


@pytest.fixture
def disk():
    """A null_blk disk of the bench's settings, removed afterwards."""
    nullb.load_module()
    why = nullb.available()
    if why is not None:
        pytest.fail(f"no null_blk: {why} (tools/vmtest loads null_blk and mounts configfs)")
    with nullb.null_blk(f"xhagent-test-{uuid.uuid4().hex[:8]}", nullb.BENCH_SETTINGS) as d:
        yield d


@pytest.fixture
def node(cgroup_root, disk, tmp_path, run_xhagent):
    """A throwaway subtree and the CLI bound to it; io.cost of the disk switched off again and
    the root's controllers put back as they were."""
    name = f"xhagent-test-{uuid.uuid4().hex[:8]}.slice"
    control = cgroup_root / "cgroup.subtree_control"
    had = set(control.read_text().split())
    majmin = (Path("/sys/block") / disk.disk / "dev").read_text().strip()
    policy = tmp_path / "io-cost.yaml"
    policy.write_text(POLICY.format(disk=disk.disk))

    def cli(*args):
        return run_xhagent("cgroup", "--subtree", name, *args, "-f", str(policy))

    cli.root, cli.majmin, cli.top = cgroup_root / name, majmin, cgroup_root
    try:
        yield cli
    finally:
        if cli.root.exists():
            for path in sorted(
                (p for p in cli.root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ) + [cli.root]:
                Cgroup(path).remove(kill_first=True, timeout=20)
        (cgroup_root / "io.cost.qos").write_text(f"{majmin} enable=0")
        for c in set(control.read_text().split()) - had:
            control.write_text(f"-{c}")


def line_of(path, majmin):
    return next((ln for ln in Path(path).read_text().splitlines() if ln.split()[0] == majmin), None)


def test_without_root_rights_the_policy_is_refused_and_the_root_untouched(node):
    model_before = (node.top / "io.cost.model").read_text()
    qos_before = (node.top / "io.cost.qos").read_text()
    res = node("apply", "--own-root", "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["actions"] == [] and len(out["errors"]) == 1
    assert "spec.ioCost needs the cgroup2 root's io.cost.model and io.cost.qos" in out["errors"][0]
    assert "--enable-io-cost" in out["errors"][0]
    assert (node.top / "io.cost.model").read_text() == model_before
    assert (node.top / "io.cost.qos").read_text() == qos_before
    assert not node.root.exists()  # nothing half applied: not even the subtree


def test_model_then_qos_written_read_back_enforcing_io_weight_and_idempotent(node):
    res = node("apply", "--own-root", "--enable-io-cost", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    applied = [(a["kind"], a["group"], a.get("file")) for a in out["apply"]["applied"]]
    model, qos = ("write", "/", "io.cost.model"), ("write", "/", "io.cost.qos")
    weight = ("write", "heavy", "io.weight")
    assert applied.index(model) < applied.index(qos) < applied.index(weight), applied
    # qos enable=1 is the policy's: no separate `MAJ:MIN enable=1` action
    assert "io-cost" not in [kind for kind, *_ in applied]
    assert out["enforcers"][node.majmin]["enforcer"] == "io.cost"
    assert not out["warnings"]

    # blk-iocost.c's own text for the values the policy gave (the bench's)
    assert line_of(node.top / "io.cost.model", node.majmin) == f"{node.majmin} {NULLB_MODEL}"
    assert line_of(node.top / "io.cost.qos", node.majmin) == f"{node.majmin} {NULLB_QOS}"
    assert node.majmin in io_cost_enabled((node.top / "io.cost.qos").read_text())
    assert (node.root / "heavy/io.weight").read_text().splitlines() == [
        "default 500",
        f"{node.majmin} 800",
    ]

    res = node("apply", "--own-root", "--enable-io-cost", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    again = json.loads(res.stdout)
    assert again["actions"] == [] and again["apply"]["applied"] == []

    # qos enable=0 put back (as the fixture does on the way out), and the plan sees it
    (node.top / "io.cost.qos").write_text(f"{node.majmin} enable=0")
    assert node.majmin not in io_cost_enabled((node.top / "io.cost.qos").read_text())
    res = node("plan", "--own-root", "--enable-io-cost", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    root = [a for a in json.loads(res.stdout)["actions"] if a["group"] == "/"]
    assert [a["file"] for a in root] == ["io.cost.qos"]  # the model is still in place
    assert (
        root[0]["value"][node.majmin]["enable"] == 1 and root[0]["old"][node.majmin]["enable"] == 0
    )
