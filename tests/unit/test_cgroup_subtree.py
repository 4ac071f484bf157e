"""Confinement to the agent's subtree, and the applier's report on a fake tree."""

import os

import pytest

from xhagent.cgroups.reconcile import Action, Plan
from xhagent.cgroups.state import apply
from xhagent.cgroups.subtree import Subtree, check_group_path


@pytest.fixture
def sub(tmp_path):
    (tmp_path / "xhagent.slice" / "a").mkdir(parents=True)
    return Subtree(tmp_path, "xhagent.slice")


@pytest.mark.parametrize(
    "name",
    [
        "..",
        "a/..",
        "../x",
        "/etc",
        "a//b",
        ".hidden",
        "cgroup.procs",
        "memory.max",
        "a b",
        "web\n",  # `$` matches before a final newline: the name is matched whole
        "a\n/b",
    ],
)
def test_bad_group_paths_are_refused(sub, name):
    with pytest.raises(ValueError):
        sub.resolve(name)


def test_a_symlink_out_of_the_subtree_is_refused(sub, tmp_path):
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", sub.path / "escape")
    with pytest.raises(ValueError, match="outside the subtree"):
        sub.resolve("escape")
    assert sub.resolve("a") == sub.path / "a"
    assert sub.walk() == ["a"]  # symlinks are not groups


def test_good_names():
    assert check_group_path("latency-critical/web_1") == "latency-critical/web_1"
    assert check_group_path("my.service") == "my.service"


def test_apply_stops_at_the_first_refusal_and_reports_the_rest(sub):
    (sub.path / "a" / "cpu.weight").write_text("100\n")
    actions = [
        Action("create", "b"),
        Action("write", "a", "cpu.weight", 400, 100, "loosen"),
        Action("write", "b", "cpu.weight", 50, None, "loosen"),
        Action("create", "c"),
    ]
    report = apply(Plan(actions=actions), sub)
    assert [a.group for a in report.applied] == ["b", "a"]
    assert (sub.path / "a" / "cpu.weight").read_text().strip() == "400"
    failed, why = report.failed
    assert failed is actions[2] and "cpu.weight" in why and "'50'" in why and "ENOENT" in why
    assert report.not_applied == [actions[3]] and not (sub.path / "c").exists()


def test_a_value_the_kernel_does_not_keep_is_a_refusal(sub):
    # A plain file keeps what it is given; a kernel that ignores a line reads back the old text.
    (sub.path / "a" / "io.weight").write_text("default 100\n")
    report = apply(
        Plan(
            actions=[
                Action("write", "a", "io.weight", {"default": 200, "259:0": 800}, None, "loosen")
            ]
        ),
        sub,
    )
    assert report.failed and "reads back" in report.failed[1]


def test_a_plan_with_errors_applies_nothing(sub):
    report = apply(Plan(actions=[Action("create", "b")], errors=["no"]), sub)
    assert not report.applied and report.not_applied and not (sub.path / "b").exists()
