"""The planner on fake trees: ordering, idempotence, controllers, io enforcement, prune."""

import pytest

from xhagent.cgroups.policy import load_policy_text
from xhagent.cgroups.reconcile import ROOT, Actual, ActualGroup, Options, plan

ALL = ["cpu", "cpuset", "io", "memory", "pids"]
HEAD = "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {name: t}\nspec:\n  groups:\n"
EXAMPLE = (
    HEAD
    + """\
    - name: lc
      io: {weight: 500, devices: {nvme0n1: 800}}
      cpu: {weight: 400, max: "50000 100000"}
      memory: {high: 3Gi, max: 4Gi}
      children:
        - name: web
          memory: {max: 1Gi}
    - name: batch
      pids: {max: 4096}
"""
)


@pytest.fixture
def sys_root(tmp_path):
    (tmp_path / "block/nvme0n1").mkdir(parents=True)
    (tmp_path / "block/nvme0n1/dev").write_text("259:0\n")
    return tmp_path


def policy(text, sys_root):
    return load_policy_text(text, "p.yaml", sys_root)


def empty(**kw):
    return Actual(root_controllers=ALL, parent_subtree_control=ALL, groups={}, **kw)


def kinds(p):
    return [(a.kind, a.group, a.file) for a in p.actions]


def converged(pol, base):
    """The actual tree after a perfect apply: every desired value in place."""
    groups = {"": ActualGroup(ALL, sorted({c for cs in pol.controllers() for c in [cs]}))}
    for g in pol.groups:
        children_need = {
            c for c, gs in pol.controllers().items() if any(x.startswith(g.path + "/") for x in gs)
        }
        groups[g.path] = ActualGroup(ALL, sorted(children_need), values=dict(g.settings))
    base.groups = groups
    return base


def test_fresh_tree_creates_enables_then_writes(sys_root):
    p = plan(policy(EXAMPLE, sys_root), empty(io_cost_enabled={"259:0"}))
    assert not p.errors
    k = kinds(p)
    assert k[:4] == [
        ("create", "", None),
        ("create", "lc", None),
        ("create", "lc/web", None),
        ("create", "batch", None),
    ]
    assert ("enable", "", "cgroup.subtree_control") in k and (
        "enable",
        "lc",
        "cgroup.subtree_control",
    ) in k
    enable_root = next(a for a in p.actions if a.kind == "enable" and a.group == "")
    assert enable_root.value == ("cpu", "io", "memory", "pids")
    # every enable comes before every write; parents are written before children
    assert max(k.index(x) for x in k if x[0] == "enable") < min(
        k.index(x) for x in k if x[0] == "write"
    )
    writes = [(a.group, a.file) for a in p.writes]
    assert writes.index(("lc", "memory.max")) < writes.index(("lc/web", "memory.max"))
    assert p.enforcers["259:0"].name == "io.cost"
    io = next(a for a in p.writes if a.file == "io.weight")
    assert io.value == {"default": 500, "259:0": 800}


def test_second_plan_after_apply_writes_nothing(sys_root):
    pol = policy(EXAMPLE, sys_root)
    p = plan(pol, converged(pol, empty(io_cost_enabled={"259:0"})))
    assert p.actions == [] and p.drift == [] and not p.errors


def test_loosen_top_down_tighten_bottom_up(sys_root):
    pol = policy(
        HEAD
        + """\
    - name: a
      memory: {max: 2Gi}
      cpu: {max: "20000 100000", max.burst: 10000}
      children:
        - name: b
          memory: {max: 1Gi}
""",
        sys_root,
    )
    actual = converged(pol, empty())
    # Loosening: the kernel has smaller limits than the policy.
    actual.groups["a"].values.update(
        {"memory.max": 1 << 30, "cpu.max": (10000, 100000), "cpu.max.burst": 5000}
    )
    actual.groups["a/b"].values["memory.max"] = 512 << 20
    order = [(a.group, a.file, a.phase) for a in plan(pol, actual).actions]
    assert order == [
        ("a", "cpu.max", "loosen"),
        ("a", "memory.max", "loosen"),
        ("a", "cpu.max.burst", "loosen"),
        ("a/b", "memory.max", "loosen"),
    ]
    # Tightening: larger now than the policy wants.
    actual.groups["a"].values.update(
        {"memory.max": "max", "cpu.max": ("max", 100000), "cpu.max.burst": 90000}
    )
    actual.groups["a/b"].values["memory.max"] = "max"
    p = plan(pol, actual)
    order = [(a.group, a.file, a.phase) for a in p.actions]
    assert order == [
        ("a/b", "memory.max", "tighten"),
        ("a", "cpu.max.burst", "tighten"),
        ("a", "cpu.max", "tighten"),
        ("a", "memory.max", "tighten"),
    ]
    assert {(a.group, a.file) for a in p.drift} == {(g, f) for g, f, _ in order}


def test_processes_moved_to_a_leaf_before_a_domain_controller(sys_root):
    pol = policy(
        HEAD + "    - name: a\n      children: [{name: b, memory: {max: 1Gi}}]\n", sys_root
    )
    actual = converged(pol, empty())
    actual.groups["a"] = ActualGroup(ALL, [], procs=[42], populated=True)
    k = kinds(plan(pol, actual))
    assert (
        k.index(("move-procs", "a", "cgroup.procs"))
        == k.index(("enable", "a", "cgroup.subtree_control")) - 1
    )
    move = plan(pol, actual).actions[k.index(("move-procs", "a", "cgroup.procs"))]
    assert move.value == "a/leaf"
    # cpu is threaded: enabling it over processes is allowed, nothing is moved
    pol = policy(HEAD + "    - name: a\n      children: [{name: b, cpu: {weight: 50}}]\n", sys_root)
    actual = converged(pol, empty())
    actual.groups["a"] = ActualGroup(ALL, [], procs=[42], populated=True)
    assert "move-procs" not in [a.kind for a in plan(pol, actual).actions]


def test_missing_controllers_refuse_the_whole_plan(sys_root):
    pol = policy(EXAMPLE, sys_root)
    p = plan(
        pol,
        Actual(
            root_controllers=["hugetlb"],
            parent_subtree_control=["hugetlb"],
            groups={},
            mode="hybrid",
            v1_controllers=("cpu", "blkio", "memory", "pids"),
        ),
    )
    assert p.actions == []
    cpu = next(e for e in p.errors if e.startswith("controller cpu"))
    assert (
        "held by a cgroup v1 hierarchy" in cpu
        and "cpu.weight (p.yaml:8:21)" in cpu
        and "mode hybrid" in cpu
    )
    assert any(e.startswith("controller io") and "held by a cgroup v1" in e for e in p.errors)


def test_controllers_at_the_cgroup2_root_need_own_root(sys_root):
    pol = policy(HEAD + "    - name: a\n      pids: {max: 10}\n", sys_root)
    actual = Actual(root_controllers=ALL, parent_subtree_control=[], groups={})
    p = plan(pol, actual)
    assert p.actions == [] and "--own-root" in p.errors[0]
    p = plan(pol, actual, Options(own_root=True))
    root = [a for a in p.actions if a.group == ROOT]
    assert [(a.kind, a.file, a.value) for a in root] == [
        ("enable", "cgroup.subtree_control", ("pids",))
    ]
    actual.systemd_root = True
    assert "systemd manages" in plan(pol, actual, Options(own_root=True)).errors[0]


def test_per_device_weight_without_an_enforcer_is_reported_not_written(sys_root):
    pol = policy(EXAMPLE, sys_root)
    p = plan(pol, empty(schedulers={"259:0": "none"}))
    io = next(a for a in p.writes if a.file == "io.weight")
    assert io.value == {"default": 500}
    assert p.enforcers["259:0"].name == "none"
    assert any(
        "nvme0n1 (259:0) is not applied" in w and "--enable-io-cost" in w for w in p.warnings
    )


def test_enable_io_cost_comes_before_the_weights(sys_root):
    p = plan(policy(EXAMPLE, sys_root), empty(), Options(enable_io_cost=True))
    k = kinds(p)
    assert k.index(("io-cost", ROOT, "io.cost.qos")) < k.index(("write", "lc", "io.weight"))
    assert next(a for a in p.writes if a.file == "io.weight").value == {
        "default": 500,
        "259:0": 800,
    }


def test_bfq_gets_io_bfq_weight_scaled(sys_root):
    p = plan(policy(EXAMPLE, sys_root), empty(schedulers={"259:0": "bfq"}))
    bfq = next(a for a in p.writes if a.file == "io.bfq.weight")
    assert bfq.value == {"default": 136, "259:0": 163}
    assert p.enforcers["259:0"].name == "bfq" and not p.warnings


def test_prune_removes_only_empty_undeclared_groups_bottom_up(sys_root):
    pol = policy(HEAD + "    - name: keep\n", sys_root)
    actual = converged(pol, empty())
    actual.groups.update(
        {
            "old": ActualGroup(),
            "old/child": ActualGroup(),
            "busy": ActualGroup(populated=True),
            "keep/leaf": ActualGroup(),
        }
    )
    assert plan(pol, actual).actions == [] and sorted(plan(pol, actual).undeclared) == [
        "busy",
        "old",
        "old/child",
    ]
    p = plan(pol, actual, Options(prune=True))
    assert kinds(p) == [("delete", "old/child", None), ("delete", "old", None)]
    assert any(w.startswith("busy: not removed") for w in p.warnings)


def test_bfq_disk_gets_the_default_weight_of_groups_without_device_weights(sys_root):
    text = HEAD + "    - name: low\n      io: {weight: 50}\n"
    p = plan(policy(text, sys_root), empty(schedulers={"259:0": "bfq", "8:0": "mq-deadline"}))
    assert [a.value for a in p.writes if a.file == "io.bfq.weight"] == [{"default": 50}]
    assert p.enforcers["259:0"].name == "bfq" and "8:0" not in p.enforcers
    # io.cost, where enabled, enforces instead: no io.bfq.weight then
    p = plan(policy(text, sys_root), empty(schedulers={"259:0": "bfq"}, io_cost_enabled={"259:0"}))
    assert not [a for a in p.writes if a.file == "io.bfq.weight"]


def test_named_bfq_disk_still_gets_io_cost_planned(sys_root):
    p = plan(
        policy(EXAMPLE, sys_root),
        empty(schedulers={"259:0": "bfq"}),
        Options(own_root=True, enable_io_cost=True),
    )
    assert p.enforcers["259:0"].name == "io.cost"
    assert ("io-cost", ROOT, "io.cost.qos") in kinds(p)


def test_what_apply_would_hit_half_way_is_a_plan_error(sys_root):
    from xhagent.cgroups.reconcile import Limit

    p = policy(
        HEAD + "    - name: a\n      children: [{name: b, children: [{name: c}]}]\n", sys_root
    )
    got = plan(
        p,
        empty(
            subtree_path="/sys/fs/cgroup/x.slice",
            limits=[
                Limit(0, "/sys/fs/cgroup/x.slice", max_depth=2, max_descendants=10, descendants=8),
                Limit(1, "/sys/fs/cgroup", max_depth=None, max_descendants=None),
            ],
        ),
    )
    assert got.actions == []
    assert got.errors == [
        "p.yaml:7:46: group a/b/c would be 3 levels below /sys/fs/cgroup/x.slice, "
        "whose cgroup.max.depth is 2",
        "3 new groups below /sys/fs/cgroup/x.slice would make 11; its cgroup.max.descendants is 10",
    ]
    long = policy(
        HEAD
        + "".join(
            f"{'  ' * i}    - name: {'n' * 250}\n{'  ' * i}      children:\n" for i in range(17)
        )
        + f"{'  ' * 17}    - name: end\n",
        sys_root,
    )
    assert any(
        "PATH_MAX" in e for e in plan(long, empty(subtree_path="/sys/fs/cgroup/x.slice")).errors
    )
    leaf = policy(HEAD + "    - name: agent.leaf\n", sys_root)
    assert plan(leaf, empty(agent_leaf="agent.leaf")).errors == [
        "p.yaml:6:13: agent.leaf holds the agent's own processes, not a managed group"
    ]


def test_a_device_this_node_lacks_is_refused_as_unsupported_here(sys_root):
    p = policy(HEAD + "    - name: a\n      io: {devices: {nvme9n9: 800}}\n", sys_root)
    got = plan(p, empty())
    assert got.actions == [] and len(got.errors) == 1
    assert got.errors[0].startswith(
        "p.yaml:7:22: spec.groups.0.io.devices: no block device 'nvme9n9' on this node"
    )
    assert got.errors[0].endswith("(not on this node: unsupported here)")
