"""apply_policy: nothing is touched when the plan has errors; otherwise the agent settles into
its leaf before the first action, all under the subtree's lock."""

from xhagent.cgroups import enact, lock
from xhagent.cgroups.delegation import Placement
from xhagent.cgroups.reconcile import Action, Options, Plan
from xhagent.cgroups.subtree import Subtree


def _setup(tmp_path, monkeypatch, plan: Plan):
    (tmp_path / "unit.service").mkdir()
    monkeypatch.setattr(lock, "LOCK_DIR", tmp_path / "locks")
    steps: list[str] = []
    monkeypatch.setattr(enact, "plan_policy", lambda *a, **k: plan)

    def settle(mount, placement):
        steps.append("settle")
        return [4242]

    def apply(p, sub, report):
        held = lock.SubtreeLock(sub.path).holder()
        steps.append(f"apply under lock of {held}")
        report.applied.extend(p.actions)
        return report

    monkeypatch.setattr(enact, "settle", settle)
    monkeypatch.setattr(enact, "apply", apply)
    placement = Placement("unit.service", "delegated", "test", leaf="agent")
    return Subtree(tmp_path, "unit.service", placement), steps


def test_a_plan_with_errors_moves_nothing_and_applies_nothing(tmp_path, monkeypatch):
    plan = Plan(actions=[Action("create", "a")], errors=["cpu: not available"])
    sub, steps = _setup(tmp_path, monkeypatch, plan)
    out = enact.apply_policy(None, sub, Options())
    assert steps == []
    assert not out.applied and out.settled == []
    assert out.report.applied == [] and out.report.not_applied == plan.actions


def test_settles_then_applies_under_the_lock(tmp_path, monkeypatch):
    import os

    plan = Plan(actions=[Action("create", "a"), Action("create", "b")])
    sub, steps = _setup(tmp_path, monkeypatch, plan)
    out = enact.apply_policy(None, sub, Options())
    assert steps == ["settle", f"apply under lock of {os.getpid()}"]
    assert out.applied and out.settled == [4242] and out.report.applied == plan.actions
    with lock.SubtreeLock(sub.path).acquire(wait=False):  # released afterwards
        pass
