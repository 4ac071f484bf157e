"""Exclusive resources and edf-pic's weights, decided without a kernel (loop/resources.py)."""

import pytest

from xhagent.daemon.loop.resources import Lent, blocker, boosted_weights, holders
from xhagent.policy.task import parse_task
from xhagent.sched.job import Job, from_task
from xhagent.spec import SpecError, load_text

WEIGHTS = {"holder": (100, 100), "urgent": (1000, 1000), "lax": (10, 10), "other": (100, 50)}


def job(name: str, deadline: int | None, *holds: str) -> Job:
    return Job(name, deadline_ns=deadline, holds=frozenset(holds))


def test_a_resource_is_held_by_the_task_that_names_it():
    held = holders([("t1", ("pcie",)), ("t2", ("licence", "disk"))])
    assert held == {"pcie": "t1", "licence": "t2", "disk": "t2"}
    assert blocker(("disk", "pcie"), held, "t3") == ("disk", "t2")
    assert blocker(("pcie",), held, "t1") is None  # its own
    assert blocker(("gpu-link",), held, "t3") is None


def test_the_holder_runs_with_the_class_of_an_earlier_deadline_waiter():
    lent = boosted_weights(
        [job("holder", 10_000, "pcie")], [job("urgent", 5_000, "pcie")], WEIGHTS.__getitem__
    )
    assert lent == {"holder": Lent((1000, 1000), (100, 100), ("urgent",), 5_000)}
    assert lent["holder"].boosted


def test_no_boost_for_a_later_deadline_a_waiter_without_one_or_a_lighter_class():
    holding = [job("holder", 10_000, "pcie")]
    weights = WEIGHTS.__getitem__
    assert boosted_weights(holding, [job("urgent", 20_000, "pcie")], weights) == {}
    assert boosted_weights(holding, [job("urgent", None, "pcie")], weights) == {}
    # earlier, but its class weighs less: the holder keeps its own weights, and stands
    # by the waiter's deadline (what preemption weighs it by)
    lent = boosted_weights(holding, [job("lax", 5_000, "pcie")], weights)
    assert lent == {"holder": Lent((100, 100), (100, 100), ("lax",), 5_000)}
    assert not lent["holder"].boosted
    # another resource: not its waiter
    assert boosted_weights(holding, [job("urgent", 5_000, "disk")], weights) == {}


def test_a_holder_without_a_deadline_takes_the_heaviest_weights_of_its_waiters():
    lent = boosted_weights(
        [job("holder", None, "pcie", "disk")],
        [job("other", 7_000, "disk"), job("urgent", 9_000, "pcie"), job("lax", 1_000, "pcie")],
        WEIGHTS.__getitem__,
    )
    assert lent == {"holder": Lent((1000, 1000), (100, 100), ("lax", "other", "urgent"), 1_000)}


TASK = (
    "apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {name: t}\n"
    "spec:\n  deviceType: cpu\n  command: [x]\n"
)


def test_a_task_names_its_resources_and_its_job_holds_them():
    task = parse_task(load_text(TASK + "  resources: [pcie-switch, licence]\n", "t.yaml")[0])
    assert task.resources == ("pcie-switch", "licence")
    assert from_task(task).holds == frozenset({"pcie-switch", "licence"})


@pytest.mark.parametrize(
    "value, message",
    [
        ("[pcie, pcie]", "t.yaml:7:21: spec.resources.1: 'pcie' is listed twice"),
        ("[PCIe]", "t.yaml:7:15: spec.resources.0: 'PCIe' is not a resource name"),
        ("pcie", "t.yaml:7:14: spec.resources: expected a list, got a string"),
        ("[" + ", ".join(f"r{i}" for i in range(17)) + "]", "more than 16"),
    ],
)
def test_bad_resources_are_refused_where_they_are(value, message):
    with pytest.raises(SpecError) as info:
        parse_task(load_text(TASK + f"  resources: {value}\n", "t.yaml")[0])
    assert message in str(info.value)
