"""`xhagent cgroup` input errors: FILE:LINE:COL on stderr, exit 2, no traceback."""

import os

from click.testing import CliRunner

from xhagent.cli import main


def test_bad_policy_exits_2_with_location(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text(
        "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nspec:\n  groups:\n"
        "    - name: a\n      cpu: {weight: 20000}\n"
    )
    for cmd in ("plan", "apply"):
        res = CliRunner().invoke(main, ["cgroup", cmd, "-f", str(bad)])
        assert res.exit_code == 2, res.output
        assert (
            f"{bad}:6:21: spec.groups.0.cpu.weight: 20000 is not a valid weight (1..10000)"
            in res.output
        )
        assert "Traceback" not in res.output


def test_missing_file_and_run_without_command(tmp_path):
    res = CliRunner().invoke(main, ["cgroup", "plan", "-f", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2 and "nope.yaml:1:1: cannot read" in res.output
    res = CliRunner().invoke(main, ["cgroup", "run", "g"])
    assert res.exit_code == 2 and "Missing argument" in res.output


def _fake_subtree(tmp_path, monkeypatch):
    """The CLI bound to a plain directory laid out as a subtree with one group `g` whose
    freeze the 'kernel' never confirms."""
    from xhagent.cgroups import cli as cgroup_cli
    from xhagent.cgroups import lock
    from xhagent.cgroups.subtree import Subtree

    g = tmp_path / "sub" / "g"
    g.mkdir(parents=True)
    (g / "cgroup.freeze").write_text("0\n")
    (g / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    monkeypatch.setattr(cgroup_cli, "locate", lambda *a, **k: Subtree(tmp_path, "sub"))
    monkeypatch.setattr(lock, "LOCK_DIR", tmp_path / "locks")
    return g


def test_sigterm_while_a_freeze_waits_thaws_back_and_exits_143(tmp_path, monkeypatch):
    import os
    import signal
    import threading

    g = _fake_subtree(tmp_path, monkeypatch)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    res = CliRunner().invoke(main, ["cgroup", "freeze", "g", "--timeout", "30"])
    timer.join()
    assert res.exit_code == 143, res.output
    assert (g / "cgroup.freeze").read_text()[0] == "0"
    assert "freeze g: stopped by SIGTERM; now populated=1 frozen=0" in res.output
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_no_wait_fails_at_once_when_another_holds_the_lock(tmp_path, monkeypatch):
    from xhagent.cgroups.lock import SubtreeLock

    g = _fake_subtree(tmp_path, monkeypatch)
    with SubtreeLock(g.parent, tmp_path / "locks").acquire():
        res = CliRunner().invoke(main, ["cgroup", "freeze", "g", "--no-wait"])
    assert res.exit_code == 1
    assert f"is being changed by pid {os.getpid()}" in res.output and "--no-wait" in res.output
    assert (g / "cgroup.freeze").read_text()[0] == "0"


def test_a_stop_during_apply_lands_between_actions_and_says_how_far_it_got(tmp_path, monkeypatch):
    import signal

    from xhagent.cgroups import enact, state
    from xhagent.cgroups.reconcile import Action, Plan

    g = _fake_subtree(tmp_path, monkeypatch)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "apiVersion: xh.scheduling/v1\nkind: CgroupPolicy\nspec:\n  groups:\n    - name: a\n"
    )
    monkeypatch.setattr(
        enact, "plan_policy", lambda *a, **k: Plan(actions=[Action("create", n) for n in "abc"])
    )
    done = []

    def run(action, sub, report):
        (g.parent / action.group).mkdir()
        if action.group == "b":
            os.kill(os.getpid(), signal.SIGTERM)  # held until this action is complete
        done.append(action.group)

    monkeypatch.setattr(state, "_run", run)
    res = CliRunner().invoke(main, ["cgroup", "apply", "-f", str(policy)])
    assert res.exit_code == 143, res.output
    assert done == ["a", "b"]
    assert "applied: create a\n  applied: create b\n  not applied: create c" in res.output
    assert "stopped by SIGTERM after 2 of 3 actions" in res.output


def test_locating_the_subtree_fails_with_a_message_not_a_traceback(monkeypatch):
    import errno

    from xhagent.cgroups import cli as cgroup_cli

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", "/sys/fs/cgroup/unit.service")

    monkeypatch.setattr(cgroup_cli, "locate", denied)
    res = CliRunner().invoke(main, ["cgroup", "show"])
    assert res.exit_code == 1 and res.exception.__class__ is SystemExit
    assert (
        "/sys/fs/cgroup/unit.service: Permission denied" in res.output and "Errno" not in res.output
    )
