"""spec.ioCost: a device's io.cost model and QoS in a CgroupPolicy, read with located errors,
planned as writes to the cgroup2 root's io.cost.model then io.cost.qos (only where the agent
may write the root, only on a kernel with io.cost), applied and read back, idempotent."""

import pytest

from xhagent.cgroups import state
from xhagent.cgroups.enact import apply_policy, plan_policy
from xhagent.cgroups.group import Cgroup
from xhagent.cgroups.nullb import NULLB_MODEL, NULLB_QOS
from xhagent.cgroups.policy import load_policy_text
from xhagent.cgroups.reconcile import ROOT, Actual, ActualGroup, Options, plan
from xhagent.cgroups.subtree import Subtree
from xhagent.spec import SpecError

ALL = ["cpu", "cpuset", "io", "memory", "pids"]
HEAD = "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {name: t}\nspec:\n"
# The bench's model and QoS (cgroups/nullb.py), as a policy writes them.
IO_COST = (
    HEAD
    + """\
  ioCost:
    nullb0:
      model: {ctrl: user, model: linear, rbps: 16000000, rseqiops: 4000, rrandiops: 4000,
              wbps: 80000000, wseqiops: 20000, wrandiops: 20000}
      qos: {enable: 1, ctrl: user, rpct: 95, rlat: 5000, wpct: 95, wlat: 5000, min: 100, max: 100}
"""
)
MODEL = {
    "ctrl": "user",
    "model": "linear",
    "rbps": 16000000,
    "rseqiops": 4000,
    "rrandiops": 4000,
    "wbps": 80000000,
    "wseqiops": 20000,
    "wrandiops": 20000,
}
QOS = {
    "enable": 1,
    "ctrl": "user",
    "rpct": 95.0,
    "rlat": 5000,
    "wpct": 95.0,
    "wlat": 5000,
    "min": 100.0,
    "max": 100.0,
}
# What the kernel's files read once the bench's values are in (blk-iocost.c's formats).
MODEL_TEXT = f"250:0 {NULLB_MODEL}\n"
QOS_TEXT = f"250:0 {NULLB_QOS}\n"


@pytest.fixture
def sys_root(tmp_path):
    for name, dev in (("nullb0", "250:0"), ("nvme0n1", "259:0")):
        (tmp_path / "block" / name).mkdir(parents=True)
        (tmp_path / "block" / name / "dev").write_text(f"{dev}\n")
    return tmp_path


def policy(text, sys_root):
    return load_policy_text(text, "p.yaml", sys_root)


def node(**kw):
    """A node with io.cost: both root files, nothing configured yet."""
    kw.setdefault("root_values", {"io.cost.model": {}, "io.cost.qos": {}})
    kw.setdefault("groups", {"": ActualGroup(ALL, ALL)})
    kw.setdefault("root_controllers", ALL)
    return Actual(parent_subtree_control=ALL, **kw)


ALLOWED = Options(enable_io_cost=True)


# ------------------------------------------------------------------ reading the file


def test_the_bench_model_and_qos_read_as_the_kernel_reads_them_back(sys_root):
    p = policy(IO_COST, sys_root)
    assert list(p.io_cost) == ["250:0"]
    spec = p.io_cost["250:0"]
    assert (spec.device, spec.model, spec.qos, spec.at) == ("nullb0", MODEL, QOS, "p.yaml:6:5")
    assert p.io_cost_at == "p.yaml:6:5" and p.groups == [] and p.absent == []
    # what the policy holds is what parse_nested_keyed makes of the kernel's text
    from xhagent.cgroups import values as v

    assert v.parse_nested_keyed(MODEL_TEXT) == {"250:0": MODEL}
    assert v.parse_nested_keyed(QOS_TEXT) == {"250:0": QOS}


def test_every_error_is_located_and_reported_at_once(sys_root):
    text = (
        HEAD
        + """\
  ioCost:
    nullb0:
      model: {ctrl: usr, model: quadratic, rbps: -1, rseqiops: 2000, colour: red}
      qos: {enable: 2, rpct: 100.5, wpct: 95.555, rlat: soon, min: 500, max: 20, x: 1}
    nvme0n1: {}
    "259:0": {model: {ctrl: auto, rbps: 1}}
    sda: {qos: {}}
    vdb: 5
"""
    )
    with pytest.raises(SpecError) as info:
        policy(text, sys_root)
    assert str(info.value).splitlines() == [
        "p.yaml:7:14: spec.ioCost.nullb0.model: a user model needs all of rbps, rseqiops, "
        "rrandiops, wbps, wseqiops, wrandiops; missing rrandiops, wbps, wseqiops, wrandiops",
        "p.yaml:7:21: spec.ioCost.nullb0.model.ctrl: 'usr' is not a valid ctrl: "
        "expected user or auto",
        "p.yaml:7:33: spec.ioCost.nullb0.model.model: 'quadratic' is not a valid model: "
        "expected linear",
        "p.yaml:7:50: spec.ioCost.nullb0.model.rbps: -1 is not a valid rate in bytes per "
        "second: -1 is out of range 0..9223372036854775807",
        "p.yaml:7:70: unknown field 'spec.ioCost.nullb0.model.colour'",
        "p.yaml:8:21: spec.ioCost.nullb0.qos.enable: 2 is not a valid enable (0 or 1): "
        "expected true, false, 0 or 1",
        "p.yaml:8:30: spec.ioCost.nullb0.qos.rpct: 100.5 is not a valid percentile: "
        "100.5 is out of range 0..100",
        "p.yaml:8:43: spec.ioCost.nullb0.qos.wpct: 95.555 is not a valid percentile: "
        "at most two decimals (the kernel keeps hundredths)",
        "p.yaml:8:57: spec.ioCost.nullb0.qos.rlat: 'soon' is not a valid latency in µs: "
        "expected an integer",
        "p.yaml:8:68: spec.ioCost.nullb0.qos: min 500 exceeds max 20",
        "p.yaml:8:82: unknown field 'spec.ioCost.nullb0.qos.x'",
        "p.yaml:9:14: spec.ioCost.nvme0n1: expected model, qos or both",
        "p.yaml:10:29: spec.ioCost.259:0.model: ctrl auto takes no rbps "
        "(the kernel would switch to user)",
        "p.yaml:11:16: spec.ioCost.sda.qos: expected at least one of enable, ctrl, rpct, "
        "rlat, wpct, wlat, min, max",
        "p.yaml:12:10: spec.ioCost.vdb: expected a mapping, got an integer",
    ]


def test_one_device_by_two_names_is_an_error(sys_root):
    text = HEAD + '  ioCost:\n    nullb0: {qos: {enable: 1}}\n    "250:0": {qos: {enable: 0}}\n'
    with pytest.raises(SpecError, match=r"^p.yaml:7:5: spec.ioCost: 250:0 is 250:0, given already"):
        policy(text, sys_root)


def test_an_unknown_field_beside_ioCost_is_still_caught(sys_root):
    with pytest.raises(SpecError, match=r"unknown field 'spec.iocost' \(did you mean 'ioCost'"):
        policy(HEAD + "  iocost: {nullb0: {qos: {enable: 1}}}\n", sys_root)


# ------------------------------------------------------------------ planning


def test_the_model_is_written_before_the_qos_at_the_root(sys_root):
    p = plan(policy(IO_COST, sys_root), node(), ALLOWED)
    assert not p.errors and not p.warnings
    root = [(a.kind, a.group, a.file, a.value) for a in p.actions if a.group == ROOT]
    assert root == [
        ("write", ROOT, "io.cost.model", {"250:0": MODEL}),
        ("write", ROOT, "io.cost.qos", {"250:0": QOS}),
    ]
    assert (
        p.actions[0].describe()
        == f"write <cgroup2 root> io.cost.model = 250:0 {NULLB_MODEL} (was unset)"
    )
    assert p.actions[1].describe() == (
        "write <cgroup2 root> io.cost.qos = 250:0 enable=1 ctrl=user rpct=95.0 rlat=5000 "
        "wpct=95.0 wlat=5000 min=100.0 max=100.0 (was unset)"
    )


def test_what_the_root_holds_already_is_not_written_again(sys_root):
    from xhagent.cgroups import values as v

    have = {
        "io.cost.model": v.parse_nested_keyed(MODEL_TEXT + "259:0 ctrl=auto model=linear\n"),
        "io.cost.qos": v.parse_nested_keyed(QOS_TEXT),
    }
    p = plan(policy(IO_COST, sys_root), node(root_values=have), ALLOWED)
    assert p.actions == [] and not p.errors
    # one key changed behind the agent's back: that device's line is written, old shown
    have["io.cost.qos"]["250:0"]["rlat"] = 250
    p = plan(policy(IO_COST, sys_root), node(root_values=have), ALLOWED)
    assert [(a.file, a.value, a.old["250:0"]["rlat"]) for a in p.actions] == [
        ("io.cost.qos", {"250:0": QOS}, 250)
    ]
    assert p.drift == p.actions


def test_without_root_rights_the_whole_policy_is_refused(sys_root):
    text = IO_COST + "  groups:\n    - name: a\n      cpu: {weight: 50}\n"
    p = plan(policy(text, sys_root), node())
    assert p.actions == []
    assert p.errors == [
        "p.yaml:6:5: spec.ioCost needs the cgroup2 root's io.cost.model and io.cost.qos: "
        "pass --enable-io-cost where the agent owns the cgroup2 root"
    ]
    p = plan(policy(text, sys_root), node(systemd_root=True), ALLOWED)
    assert p.actions == [] and p.errors[0].endswith(": systemd manages the cgroup2 root")


def test_a_node_without_io_cost_says_so(sys_root):
    p = plan(policy(IO_COST, sys_root), node(root_values={}), ALLOWED)
    assert p.actions == []
    assert p.errors == [
        "p.yaml:6:5: spec.ioCost: this node has no io.cost (the cgroup2 root has no "
        "io.cost.model or io.cost.qos: a kernel built without CONFIG_BLK_CGROUP_IOCOST)"
    ]
    p = plan(
        policy(IO_COST, sys_root),
        node(root_values={}, root_controllers=["cpu", "memory"]),
        ALLOWED,
    )
    assert p.errors[0].endswith("the io controller is not in cgroup2 here)")


def test_an_absent_device_is_refused_as_unsupported_here(sys_root):
    p = policy(HEAD + "  ioCost:\n    nvme9n9: {qos: {enable: 1}}\n", sys_root)
    assert p.io_cost == {}
    got = plan(p, node(), ALLOWED)
    assert got.actions == [] and len(got.errors) == 1
    assert got.errors[0].startswith(
        "p.yaml:6:5: spec.ioCost: no block device 'nvme9n9' on this node"
    )
    assert got.errors[0].endswith("(not on this node: unsupported here)")


def test_qos_enable_planned_enforces_per_device_weights_without_a_second_enable(sys_root):
    text = (
        HEAD
        + "  ioCost:\n    nvme0n1: {qos: {enable: 1}}\n"
        + "  groups:\n    - name: a\n      io: {weight: 500, devices: {nvme0n1: 800}}\n"
    )
    p = plan(policy(text, sys_root), node(groups={}), ALLOWED)
    assert not p.errors and not p.warnings
    assert [a.kind for a in p.actions if a.group == ROOT] == ["write"]
    assert p.enforcers["259:0"].name == "io.cost"
    assert "planned (spec.ioCost)" in p.enforcers["259:0"].note
    kinds = [(a.kind, a.group, a.file) for a in p.actions]
    assert kinds.index(("write", ROOT, "io.cost.qos")) < kinds.index(("write", "a", "io.weight"))
    assert next(a for a in p.writes if a.file == "io.weight").value == {
        "default": 500,
        "259:0": 800,
    }


def test_qos_enable_0_wins_over_enable_io_cost_for_its_device(sys_root):
    text = (
        HEAD
        + "  ioCost:\n    nvme0n1: {qos: {enable: 0}}\n"
        + "  groups:\n    - name: a\n      io: {weight: 500, devices: {nvme0n1: 800}}\n"
    )
    have = {"io.cost.model": {}, "io.cost.qos": {"259:0": {"enable": 1}}}
    p = plan(
        policy(text, sys_root),
        node(groups={}, root_values=have, io_cost_enabled={"259:0"}),
        ALLOWED,
    )
    assert not p.errors
    assert [(a.kind, a.file, a.value) for a in p.actions if a.group == ROOT] == [
        ("write", "io.cost.qos", {"259:0": {"enable": 0}})
    ]
    assert p.enforcers["259:0"].name == "none"
    assert "spec.ioCost sets io.cost.qos enable=0" in p.enforcers["259:0"].note
    assert next(a for a in p.writes if a.file == "io.weight").value == {"default": 500}


# ------------------------------------------------------------------ on a fake cgroup tree


def _files(directory, files: dict[str, str]) -> None:
    directory.mkdir()
    for name, text in files.items():
        (directory / name).write_text(text)


@pytest.fixture
def tree(tmp_path):
    """A cgroup2 root with io.cost (its files empty: no device configured) and the agent's
    subtree already there."""
    mount = tmp_path / "cg"
    _files(
        mount,
        {
            "cgroup.controllers": " ".join(ALL),
            "cgroup.subtree_control": "",
            "io.cost.model": "",
            "io.cost.qos": "",
            "cgroup.max.depth": "max",
            "cgroup.max.descendants": "max",
            "cgroup.stat": "nr_descendants 1\n",
        },
    )
    _files(
        mount / "xhagent.slice",
        {
            "cgroup.controllers": " ".join(ALL),
            "cgroup.subtree_control": "",
            "cgroup.procs": "",
            "cgroup.events": "populated 0\nfrozen 0\n",
        },
    )
    return Subtree(mount, "xhagent.slice")


def test_plan_apply_read_back_and_a_second_plan_plans_nothing(tree, sys_root, monkeypatch):
    from xhagent.cgroups import lock

    monkeypatch.setattr(lock, "LOCK_DIR", tree.mount.parent / "locks")
    pol = policy(IO_COST, sys_root)
    refused = plan_policy(pol, tree, Options())
    assert refused.actions == [] and "--enable-io-cost" in refused.errors[0]
    out = apply_policy(pol, tree, ALLOWED)
    assert out.applied and out.report.ok, out.report.failed
    assert [a.file for a in out.report.applied] == ["io.cost.model", "io.cost.qos"]
    assert (tree.mount / "io.cost.model").read_text() == (
        "250:0 ctrl=user model=linear rbps=16000000 rseqiops=4000 rrandiops=4000 "
        "wbps=80000000 wseqiops=20000 wrandiops=20000"
    )
    assert (tree.mount / "io.cost.qos").read_text() == (
        "250:0 enable=1 ctrl=user rpct=95.0 rlat=5000 wpct=95.0 wlat=5000 min=100.0 max=100.0"
    )
    # the kernel's own spelling of the same values (`95.00`) is the same to the planner
    (tree.mount / "io.cost.qos").write_text(QOS_TEXT)
    assert plan_policy(pol, tree, ALLOWED).actions == []


def test_a_value_that_does_not_read_back_is_a_refusal(tree, sys_root, monkeypatch):
    real = Cgroup.set

    def clamped(self, f, value):  # a kernel that keeps something else
        if f.name == "io.cost.qos":
            (self.path / f.name).write_text("250:0 enable=1 ctrl=user rpct=95.00 rlat=250")
            return
        real(self, f, value)

    monkeypatch.setattr(Cgroup, "set", clamped)
    p = plan_policy(policy(IO_COST, sys_root), tree, ALLOWED)
    report = state.apply(p, tree)
    assert [a.file for a in report.applied] == ["io.cost.model"]
    assert report.failed[0].file == "io.cost.qos" and "reads back" in report.failed[1]


def test_only_io_cost_files_may_be_written_at_the_root(tree):
    from xhagent.cgroups.reconcile import Action, Plan

    report = state.apply(Plan(actions=[Action("write", ROOT, "cpu.weight", 5)]), tree)
    assert "not allowed at the cgroup2 root" in report.failed[1]
