"""The daemon's pure parts: a leaf's limits, submissions, the policy set, the directory watch."""

import os

import pytest

from xhagent.cgroups import registry
from xhagent.daemon.exec.leaf import enforcement_reason, plan_leaf
from xhagent.daemon.loop.submission import InvalidTask, parse_submission
from xhagent.daemon.policies.policy_set import PolicySet
from xhagent.daemon.policies.sources import PolicyError, parse_source
from xhagent.daemon.policies.watch import DirectoryWatch
from xhagent.daemon.store import Store
from xhagent.policy.classes import class_weights

TASK = "apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {{name: {name}}}\nspec:\n{spec}"
POLICY = (
    "apiVersion: xh.scheduling/v1\nkind: SchedulingPolicy\nmetadata: {{name: {name}}}\n"
    "spec:\n  priority: {priority}\n  matchRules:\n    - selector: {{matchLabels: {{app: x}}}}\n"
)


# -- leaf limits -------------------------------------------------------------------------------
def test_a_leaf_gets_its_placement_request_and_class():
    plan = plan_leaf(cpus=[3, 2], mems=[0], memory=1 << 30, weights=(1000, 1000), missing={})
    assert [(f, v) for f, v in plan.settings] == [
        (registry.CPUSET_CPUS, "2-3"),
        (registry.CPUSET_MEMS, "0"),
        (registry.MEMORY_MAX, 1 << 30),
        (registry.MEMORY_SWAP_MAX, 0),
        (registry.CPU_WEIGHT, 1000),
        (registry.IO_WEIGHT, {"default": 1000}),
    ]
    assert plan.unenforced == ()


def test_what_the_node_cannot_enforce_is_listed_with_the_reason_never_dropped():
    missing = {"memory": "no memory controller", "io": "no io controller"}
    plan = plan_leaf(cpus=[0], mems=[0], memory=5000, weights=(100, 10), missing=missing)
    assert [f.name for f, _ in plan.settings] == ["cpuset.cpus", "cpuset.mems", "cpu.weight"]
    assert [str(u) for u in plan.unenforced] == [
        "memory.max=5000: no memory controller",
        "io.weight=10: no io controller",
    ]
    assert enforcement_reason(["cpu"], missing) is None
    why = enforcement_reason(["memory", "cpu"], missing)
    assert why.startswith("EnforcementUnavailable:") and "memory: no memory controller" in why


def test_classes_map_to_weights_and_an_unknown_one_names_the_known():
    assert class_weights("latency") == (1000, 1000) and class_weights("batch") == (100, 100)
    with pytest.raises(KeyError, match="defined: batch, besteffort, latency"):
        class_weights("urgent")


# -- submissions -------------------------------------------------------------------------------
def test_a_submission_needs_a_command_and_a_known_class_and_says_where(tmp_path):
    text = TASK.format(name="a", spec="  deviceType: cpu\n  class: urgent\n") + (
        "---\n" + TASK.format(name="b", spec="  deviceType: cpu\n  command: [true]\n")
    )
    with pytest.raises(InvalidTask) as info:
        parse_submission(text, "t.yaml")
    # every error of the file, each where it is
    assert str(info.value).splitlines() == [
        "t.yaml:5:3: missing required field 'spec.command' (the argv to run, such as "
        "[sh, -c, 'echo hi'])",
        't.yaml:13:13: spec.command.0: expected a string, got a boolean (quote it: "true")',
    ]
    assert parse_submission(
        TASK.format(name="ok", spec="  deviceType: cpu\n  command: [x]\n"), "t.yaml"
    )[0].command == ("x",)
    with pytest.raises(
        InvalidTask, match=r"^t.yaml:2:7: kind: 'SchedulingPolicy' is not one of Task"
    ):
        parse_submission(POLICY.format(name="p", priority=1), "t.yaml")


def test_a_class_the_agent_does_not_define_is_refused_at_its_position():
    text = TASK.format(name="a", spec="  deviceType: cpu\n  command: [x]\n  class: urgent\n")
    with pytest.raises(InvalidTask, match=r"^t.yaml:7:10: spec.class: 'urgent' is not a class"):
        parse_submission(text, "t.yaml", {"batch", "latency"})
    # a stored task read again is not refused for a class removed since
    assert parse_submission(text, "t.yaml")[0].task_class == "urgent"


def test_cgroup_policies_add_and_override_classes():
    from xhagent.policy.classes import class_table

    table = class_table([{"bulk": (7, 8)}, {"latency": (500, 400), "bulk": (9, 9)}])
    assert table["bulk"] == (9, 9) and table["latency"] == (500, 400)
    assert table["batch"] == (100, 100)


# -- policies ----------------------------------------------------------------------------------
def test_parse_source_reads_both_kinds_and_refuses_anything_else():
    (p,) = parse_source(POLICY.format(name="p", priority=60), "p.yaml")
    assert (p.kind, p.name, p.value.priority) == ("SchedulingPolicy", "p", 60)
    cg = (
        "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {name: c}\n"
        "spec:\n  groups:\n    - name: a\n      cpu: {weight: 200}\n"
    )
    (c,) = parse_source(cg, "c.yaml")
    assert (c.kind, c.name) == ("CgroupPolicy", "c")
    with pytest.raises(PolicyError, match=r"^p.yaml:5:13: spec.priority: 700 is out of range"):
        parse_source(POLICY.format(name="p", priority=700), "p.yaml")
    with pytest.raises(PolicyError, match="Task"):
        parse_source(TASK.format(name="t", spec="  deviceType: cpu\n"), "t.yaml")


@pytest.fixture
def policies(tmp_path):
    store = Store.open(tmp_path / "state")
    seen: list[tuple[str, str]] = []
    directory = tmp_path / "policies.d"
    directory.mkdir()
    ps = PolicySet(directory, store, lambda: 1, lambda kind, msg: seen.append((kind, msg)))
    yield ps, directory, seen, store
    store.close()


def test_a_refusal_is_one_line_and_said_once_until_it_changes(policies):
    ps, directory, seen, _ = policies
    bad = POLICY.format(name="p", priority=700).replace("matchRules", "matchRulez")
    (directory / "p.yaml").write_text(bad)
    for _ in range(3):  # the file read again, unchanged: SIGHUP, a watch event
        assert ps.reload({"p.yaml"}) is False
    rejected = [m for k, m in seen if k == "PolicyRejected"]
    assert len(rejected) == 1, rejected
    (message,) = rejected
    assert "\n" not in message and message.count(f"{directory / 'p.yaml'}:") >= 2, message
    (directory / "p.yaml").write_text(bad.replace("700", "800"))  # another refusal: said
    assert ps.reload({"p.yaml"}) is False
    assert len([k for k, _ in seen if k == "PolicyRejected"]) == 2
    (directory / "p.yaml").write_text(POLICY.format(name="p", priority=60))
    assert ps.reload({"p.yaml"}) is True
    (directory / "p.yaml").write_text(bad)  # refused again after it was good: said again
    assert ps.reload({"p.yaml"}) is False
    assert len([k for k, _ in seen if k == "PolicyRejected"]) == 3


def test_a_bad_file_keeps_its_previous_version_in_force(policies):
    ps, directory, seen, _ = policies
    (directory / "p.yaml").write_text(POLICY.format(name="p", priority=60))
    (directory / "notes.txt").write_text("not a policy")
    assert ps.reload() is True
    assert [p.priority for p in ps.scheduling()] == [60]
    (directory / "p.yaml").write_text(POLICY.format(name="p", priority=700))
    assert ps.reload({"p.yaml"}) is False
    assert [p.priority for p in ps.scheduling()] == [60]
    kind, message = seen[-1]
    assert kind == "PolicyRejected" and f"{directory / 'p.yaml'}:5:13" in message
    assert "previous version stays in force" in message
    (directory / "p.yaml").unlink()
    assert ps.reload({"p.yaml"}) is True and ps.scheduling() == []


def test_one_definition_per_name_across_files_and_the_api(policies):
    ps, directory, seen, store = policies
    (directory / "a.yaml").write_text(POLICY.format(name="p", priority=60))
    (directory / "b.yaml").write_text(POLICY.format(name="p", priority=70))
    ps.reload()
    assert [p.priority for p in ps.scheduling()] == [60]
    assert "already defined by" in seen[-1][1]
    with pytest.raises(PolicyError, match="already defined by") as info:
        ps.apply(POLICY.format(name="p", priority=80), "api.yaml")
    assert not info.value.invalid
    (info_,), enacted = ps.apply(POLICY.format(name="q", priority=80), "api.yaml")
    assert (
        info_["version"] == 1
        and enacted is None
        and {p.name for p in ps.scheduling()} == {"p", "q"}
    )
    # kept in the store: a new set (a restarted agent) has it
    again = PolicySet(directory, store, lambda: 1, lambda *a: None)
    assert [p.name for p in again.scheduling()] == ["q"]
    with pytest.raises(PolicyError, match="remove the file"):
        ps.remove("SchedulingPolicy", "p")
    assert ps.remove("", "q")["name"] == "q"
    with pytest.raises(KeyError):
        ps.remove("", "q")


def test_a_file_of_many_policies_is_stored_once_and_each_reads_back_alone(policies):
    ps, directory, _, store = policies
    text = "---\n".join(POLICY.format(name=f"p{i}", priority=i % 100) for i in range(300))
    infos, _ = ps.apply(text, "many.yaml")
    assert len(infos) == 300
    stored = store.active_policies()
    # each keeps its own document: the file once, not 300 times (13.8 MB of a 46 KB file)
    assert sum(len(r.source) for r in stored) <= len(text) + 300 * 8
    again = PolicySet(directory, store, lambda: 1, lambda *a: None)
    assert {(p.name, p.priority) for p in again.scheduling()} == {
        (f"p{i}", i % 100) for i in range(300)
    }
    # one policy of the file changed: only its version moves
    changed = text.replace("name: p7}", "name: p7, labels: {x: y}}")
    versions = {i["name"]: i["version"] for i in ps.apply(changed, "many.yaml")[0]}
    assert versions["p7"] == 2 and versions["p8"] == 1


def test_a_sibling_removed_from_an_applied_file_stays_removed_after_a_restart(policies):
    ps, directory, seen, store = policies
    both = POLICY.format(name="a", priority=60) + "---\n" + POLICY.format(name="b", priority=70)
    ps.apply(both, "two.yaml")
    # as an older agent kept it: each policy's row holding the whole file
    store.put_policy("SchedulingPolicy", "a", both, "two.yaml")
    store.put_policy("SchedulingPolicy", "b", both, "two.yaml")
    ps.remove("SchedulingPolicy", "b")
    again = PolicySet(directory, store, lambda: 1, lambda *a: None)
    assert [(p.name, p.priority) for p in again.scheduling()] == [("a", 60)]


def test_a_stored_policy_that_no_longer_reads_is_said_and_the_rest_are_in_force(policies):
    _, directory, _, store = policies
    store.put_policy("SchedulingPolicy", "good", POLICY.format(name="good", priority=5), "g")
    store.put_policy("SchedulingPolicy", "bad", POLICY.format(name="bad", priority=700), "b")
    store.put_policy("SchedulingPolicy", "gone", POLICY.format(name="other", priority=5), "o")
    seen: list[tuple[str, str]] = []
    again = PolicySet(directory, store, lambda: 1, lambda k, m: seen.append((k, m)))
    assert [p.name for p in again.scheduling()] == ["good"]
    assert [k for k, _ in seen] == ["PolicyRejected", "PolicyRejected"]
    bad, gone = sorted(m for _, m in seen)
    assert bad.startswith("SchedulingPolicy bad version 1, applied through the API, is not")
    assert "b:5:13: spec.priority: 700 is out of range" in bad
    assert gone.endswith("is not in force: the text kept for it defines no such policy")


CGROUP = (
    "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nmetadata: {{name: {name}}}\n"
    "spec:\n  groups:\n    - name: a\n      cpu: {{weight: {weight}}}\n"
)


@pytest.fixture
def enacting(tmp_path):
    """A policy set whose kernel is a function: weights above 1000 are refused."""
    from xhagent.daemon.policies.enact import Enacted

    store = Store.open(tmp_path / "state")
    directory = tmp_path / "policies.d"
    directory.mkdir()
    seen, enacted, woken = [], [], []

    def enact(policy):
        enacted.append(policy.name)
        weight = policy.groups[0].settings["cpu.weight"]
        if weight > 1000:
            why = f"write a cpu.weight = {weight}: the node refuses it"
            return Enacted(policy.name, "unified", not_applied=(why,))
        return Enacted(
            policy.name, "unified", changes=("create a", f"write a cpu.weight = {weight}")
        )

    ps = PolicySet(directory, store, lambda: 1, lambda k, m: seen.append((k, m)), enact)
    ps.on_change = lambda: woken.append(1)
    yield ps, directory, store, seen, enacted, woken
    store.close()


def test_an_api_applied_cgroup_policy_goes_to_the_kernel_in_one_commit(enacting):
    from xhagent.daemon.policies.policy_set import PolicyNotApplied

    ps, _, store, seen, enacted, woken = enacting
    seq = store.last_event_seq()
    with pytest.raises(PolicyNotApplied) as refused:
        ps.apply(CGROUP.format(name="c", weight=5000), "c.yaml")
    assert not refused.value.invalid  # FAILED_PRECONDITION, not bad input
    assert str(refused.value).splitlines() == [
        "CgroupPolicy c was not applied (cgroup mode unified):",
        "  write a cpu.weight = 5000: the node refuses it",
    ]
    # nothing recorded, nothing in force, no event, the loop not woken
    assert store.active_policies() == [] and ps.cgroup() == [] and woken == []
    assert store.last_event_seq() == seq
    (info,), done = ps.apply(CGROUP.format(name="c", weight=300), "c.yaml")
    assert info["version"] == 1 and done.changes == ("create a", "write a cpu.weight = 300")
    events = store.events(seq)
    assert [(e.kind, e.message) for e in events] == [
        ("PolicyApplied", "CgroupPolicy c version 1 from c.yaml (2 cgroup changes)")
    ]
    assert woken == [1] and [p.name for p in ps.cgroup()] == ["c"]
    assert ps.remove("CgroupPolicy", "c")["version"] == 1
    assert [e.kind for e in store.events(events[-1].seq)] == ["PolicyRemoved"]
    assert woken == [1, 1] and enacted == ["c", "c"]


def test_a_cgroup_policy_file_the_node_cannot_enforce_changes_nothing(enacting):
    ps, directory, _, seen, enacted, woken = enacting
    path = directory / "c.yaml"
    path.write_text(CGROUP.format(name="c", weight=200))
    assert ps.reload() is True and woken == [1]
    assert seen[-1] == ("PolicyLoaded", f"{path}: CgroupPolicy c (2 cgroup changes)")
    assert ps.reload() is False and enacted == ["c"]  # the same text again: no change
    path.write_text(CGROUP.format(name="c", weight=9000))
    assert ps.reload({"c.yaml"}) is False and woken == [1]
    kind, message = seen[-1]
    assert kind == "PolicyRejected" and "cgroup mode unified" in message
    assert message.endswith("(the previous version stays in force)")
    assert ps.cgroup()[0].groups[0].settings["cpu.weight"] == 200


# -- the directory watch -------------------------------------------------------------------------
def test_the_watch_reports_whole_files(tmp_path):
    with DirectoryWatch(tmp_path) as watch:
        assert watch.changes() == set()
        (tmp_path / "a.yaml").write_text("x")
        tmp = tmp_path / ".b.yaml.tmp"
        tmp.write_text("y")
        os.rename(tmp, tmp_path / "b.yaml")
        (tmp_path / "a.yaml").unlink()
        assert {"a.yaml", "b.yaml"} <= watch.changes()
        assert watch.changes() == set()
    with pytest.raises(OSError, match="watching"):
        DirectoryWatch(tmp_path / "missing")


def test_a_configmap_volume_update_is_picked_up(policies):
    """kubelet's layout: the files are symlinks through `..data`, which is renamed onto a
    new timestamped folder when the ConfigMap changes; no event names the files."""
    ps, directory, _, _ = policies

    def publish(stamp: str, priority: int) -> None:
        (directory / stamp).mkdir()
        (directory / stamp / "p.yaml").write_text(POLICY.format(name="p", priority=priority))
        os.symlink(stamp, directory / "..data_tmp")
        os.rename(directory / "..data_tmp", directory / "..data")

    publish("..2026_11_30_01", 60)
    os.symlink("..data/p.yaml", directory / "p.yaml")
    with DirectoryWatch(directory) as watch:
        assert ps.reload() is True and [p.priority for p in ps.scheduling()] == [60]
        publish("..2026_11_30_02", 70)
        changes = watch.changes()
        assert "p.yaml" not in changes
        assert ps.reload(changes) is True and [p.priority for p in ps.scheduling()] == [70]


@pytest.mark.parametrize("args", [["ps"], ["get", "t0000001"], ["events"], ["cancel", "t1"]])
def test_every_client_says_in_one_line_that_no_agent_runs(tmp_path, monkeypatch, args):
    from click.testing import CliRunner

    from xhagent.cli import main

    monkeypatch.setenv("XHAGENT_SOCKET", str(tmp_path / "agent.sock"))
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1
    assert res.output == (
        f"xhagent: no agent at {tmp_path / 'agent.sock'}: start it with `xhagent run`\n"
    )
