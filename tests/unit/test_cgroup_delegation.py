"""Discovery of the agent's subtree: explicit path, systemd delegation, or the default, on
fake trees."""

import errno
import os

import pytest

from xhagent.cgroups import delegation
from xhagent.cgroups.mounts import Hierarchy, Mount
from xhagent.cgroups.subtree import Subtree, locate

UNIT = "system.slice/xhagent.service"


def marks(*delegated, unreadable=False):
    """A delegate-mark reader over relative paths: the given ones are marked."""
    return lambda rel: None if unreadable else rel in delegated


def test_without_systemd_the_default_slice_under_the_root():
    p = delegation.decide_placement("/", systemd=False, mark=marks())
    assert (p.rel, p.how, p.leaf) == ("xhagent.slice", "default", "")
    assert "no systemd" in p.why


def test_a_delegated_unit_cgroup_is_the_subtree_and_the_agent_gets_a_leaf():
    p = delegation.decide_placement(f"/{UNIT}", systemd=True, mark=marks(UNIT))
    assert (p.rel, p.how, p.leaf) == (UNIT, "delegated", "agent.leaf")
    assert "trusted.delegate" in p.why


def test_after_the_move_the_leaf_is_recognised_as_the_agents_own():
    p = delegation.decide_placement(f"/{UNIT}/agent.leaf", systemd=True, mark=marks(UNIT))
    assert (p.rel, p.leaf) == (UNIT, "agent.leaf")
    # A leaf name under an undelegated parent is nothing special.
    with pytest.raises(delegation.DelegationError):
        delegation.decide_placement(f"/{UNIT}/agent.leaf", systemd=True, mark=marks())


def test_under_systemd_an_undelegated_cgroup_is_refused_with_what_to_do():
    with pytest.raises(delegation.DelegationError) as info:
        delegation.decide_placement(
            "/user.slice/user-0.slice/session-3.scope", systemd=True, mark=marks()
        )
    msg = str(info.value)
    assert "/user.slice/user-0.slice/session-3.scope is not delegated" in msg
    assert "Delegate=yes" in msg and "--subtree" in msg and "cannot be read" not in msg
    with pytest.raises(delegation.DelegationError, match="cannot be read"):
        delegation.decide_placement(f"/{UNIT}", systemd=True, mark=marks(unreadable=True))


def test_a_marked_cgroup_is_delegated_without_systemd_too():
    assert (
        delegation.decide_placement(f"/{UNIT}", systemd=False, mark=marks(UNIT)).how == "delegated"
    )


def test_explicit_choices_win():
    p = delegation.decide_placement(
        f"/{UNIT}", systemd=True, mark=marks(), subtree="/ops/agent.slice"
    )
    assert (p.rel, p.how, p.leaf) == ("ops/agent.slice", "option", "")
    # --delegated where systemd sets no mark (a user manager, an old systemd, no xattrs).
    p = delegation.decide_placement(
        f"/{UNIT}", systemd=True, mark=marks(unreadable=True), delegated=True
    )
    assert (p.rel, p.how, p.why.count("--delegated")) == (UNIT, "delegated", 1)
    with pytest.raises(delegation.DelegationError):
        delegation.decide_placement(f"/{UNIT}", systemd=True, mark=marks(UNIT), delegated=False)
    with pytest.raises(delegation.DelegationError, match="cgroup2 root"):
        delegation.decide_placement("/", systemd=False, mark=marks(), delegated=True)
    with pytest.raises(ValueError, match="not a group name|letters"):
        delegation.decide_placement(f"/{UNIT}", systemd=True, mark=marks(UNIT), leaf="../x")


WORKLOADS = "system.slice/xhagent-workloads.service"


def test_a_named_subtree_its_manager_delegated_gets_the_leaf():
    # The package's layout: the agent runs in xhagent.service (not delegated) and names the
    # cgroup of xhagent-workloads.service (Delegate=), whose holder process is moved into
    # the leaf so that controllers can be enabled for the workloads' groups.
    p = delegation.decide_placement(
        f"/{UNIT}", systemd=True, mark=marks(WORKLOADS), subtree=WORKLOADS
    )
    assert (p.rel, p.how, p.leaf) == (WORKLOADS, "delegated", "agent.leaf")
    assert "--subtree" in p.why and "trusted.delegate" in p.why
    # A leading slash is the same cgroup; the agent's own cgroup plays no part.
    p = delegation.decide_placement(
        "/", systemd=False, mark=marks(WORKLOADS), subtree=f"/{WORKLOADS}"
    )
    assert (p.rel, p.how, p.leaf) == (WORKLOADS, "delegated", "agent.leaf")


def test_a_named_unmarked_subtree_is_taken_as_given_without_a_leaf():
    for own, delegated in ((f"/{UNIT}", None), (f"/{UNIT}", True), ("/", None)):
        p = delegation.decide_placement(
            own, systemd=True, mark=marks(UNIT), subtree="ops/agent.slice", delegated=delegated
        )
        assert (p.rel, p.how, p.leaf) == ("ops/agent.slice", "option", "")
    # Unreadable marks (no xattrs) and the root: as given.
    p = delegation.decide_placement(
        "/", systemd=True, mark=marks(unreadable=True), subtree=WORKLOADS
    )
    assert (p.rel, p.how, p.leaf) == (WORKLOADS, "option", "")
    p = delegation.decide_placement("/", systemd=False, mark=lambda rel: True, subtree="/")
    assert (p.rel, p.how, p.leaf) == ("", "option", "")


def test_own_marked_cgroup_without_a_named_subtree_is_unchanged():
    # Both marked: with no --subtree the agent's own delegated unit cgroup is the subtree.
    p = delegation.decide_placement(f"/{UNIT}", systemd=True, mark=marks(UNIT, WORKLOADS))
    assert (p.rel, p.how, p.leaf) == (UNIT, "delegated", "agent.leaf")
    assert "--subtree" not in p.why


def test_discovery_reads_the_named_subtrees_mark_and_locate_gives_it_a_leaf(tree):
    root, proc, run = tree
    (root / WORKLOADS).mkdir(parents=True)
    run.mkdir()  # systemd: the agent's own cgroup is not delegated, which no longer matters
    seen = []

    def reader(path):
        seen.append(path)
        return path == root / WORKLOADS

    p = delegation.discover_placement(root, WORKLOADS, proc_cgroup=proc, run_dir=run, reader=reader)
    assert (p.rel, p.how, p.leaf) == (WORKLOADS, "delegated", "agent.leaf")
    assert seen == [root / WORKLOADS]
    hier = Hierarchy((), Mount(str(root), "cgroup2"), "unified")
    sub = locate(WORKLOADS, hier, proc_cgroup=proc, run_dir=run, reader=reader)
    assert sub.path == root / WORKLOADS and sub.agent_leaf == "agent.leaf"
    # A named path is checked before any mark is read.
    seen.clear()
    with pytest.raises(ValueError):
        locate("system.slice/../etc", hier, proc_cgroup=proc, run_dir=run, reader=reader)
    assert seen == []


@pytest.mark.parametrize(
    "attrs, expected",
    [
        ({"trusted.delegate": b"1"}, True),
        ({"user.delegate": b"1"}, True),
        (
            {"trusted.delegate": b"0", "user.delegate": b"1"},
            False,
        ),  # trusted.* decides when present
        ({}, False),
        (None, None),  # the filesystem keeps no xattrs
    ],
)
def test_delegate_mark_follows_systemds_reading(monkeypatch, attrs, expected):
    def getxattr(path, name):
        if attrs is None:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        if name not in attrs:
            raise OSError(errno.ENODATA, os.strerror(errno.ENODATA))
        return attrs[name]

    monkeypatch.setattr(delegation.os, "getxattr", getxattr)
    assert delegation.read_delegate_mark("/x") is expected


@pytest.fixture
def tree(tmp_path):
    """A fake cgroup2 root with a systemd-style unit cgroup, a /proc/self/cgroup file and no
    /run/systemd/system."""
    root = tmp_path / "cgroup"
    (root / UNIT).mkdir(parents=True)
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"0::/{UNIT}\n")
    return root, proc, tmp_path / "run-systemd-system"


def test_systemd_is_seen_by_init_scope_or_run_dir(tree):
    root, _, run = tree
    assert not delegation.under_systemd(root, run)
    run.mkdir()
    assert delegation.under_systemd(root, run)
    run.rmdir()
    (root / "init.scope").mkdir()
    assert delegation.under_systemd(root, run)


def test_discovery_reads_own_cgroup_and_its_mark(tree):
    root, proc, run = tree
    seen = []

    def reader(path):
        seen.append(path)
        return path == root / UNIT

    p = delegation.discover_placement(root, proc_cgroup=proc, run_dir=run, reader=reader)
    assert (p.rel, p.how) == (UNIT, "delegated") and seen == [root / UNIT]
    run.mkdir()
    with pytest.raises(delegation.DelegationError):
        delegation.discover_placement(
            root, proc_cgroup=proc, run_dir=run, reader=lambda path: False
        )
    proc.write_text("0::/elsewhere.scope\n")  # not in this mount: nobody's delegation here
    with pytest.raises(delegation.DelegationError):
        delegation.discover_placement(root, proc_cgroup=proc, run_dir=run, reader=lambda path: True)


def test_locate_binds_the_placement_and_hides_the_agents_leaf(tree):
    root, proc, run = tree
    (root / UNIT / "agent.leaf").mkdir()
    (root / UNIT / "web").mkdir()
    hier = Hierarchy((), Mount(str(root), "cgroup2"), "unified")
    sub = locate(None, hier, proc_cgroup=proc, run_dir=run, reader=lambda path: True)
    assert isinstance(sub, Subtree) and sub.path == root / UNIT and sub.agent_leaf == "agent.leaf"
    assert sub.walk() == ["web"]
    with pytest.raises(ValueError, match="agent's own processes"):
        sub.resolve("agent.leaf/x")
    assert sub.resolve("web") == root / UNIT / "web"
    explicit = locate("ops.slice", hier, proc_cgroup=proc, run_dir=run, reader=lambda path: True)
    assert (explicit.rel, explicit.placement.how, explicit.agent_leaf) == (
        "ops.slice",
        "option",
        "",
    )
    with pytest.raises(ValueError):
        locate("../etc", hier)


def test_walk_skips_the_agent_leaf_and_systemds_control_group(tmp_path):
    for name in ("agent.leaf", ".control", "web", "web/api"):
        (tmp_path / "unit" / name).mkdir(parents=True)
    placement = delegation.decide_placement("/unit", systemd=True, mark=marks("unit"))
    assert Subtree(tmp_path, "unit", placement).walk() == ["web", "web/api"]
