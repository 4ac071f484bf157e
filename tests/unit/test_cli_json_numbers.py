"""What the CLI prints as JSON keeps 64-bit integers numbers (protobuf's JSON mapping writes
them as strings), in nested messages too, and leaves every other field as protobuf shows it."""

import json

from xhagent.daemon.api.cli import task_json
from xhagent.daemon.api.v1 import agent_pb2 as pb

BIG = 1796323447650380444  # past 2**53: a double would lose it, a Python int does not


def test_wide_integers_are_numbers_at_any_depth():
    task = pb.Task(id="t1", created_ns=BIG, output_dropped_bytes=7, cpus=[0, 3])
    task.labels["app"] = "web"
    task.reasons.add(kind="Queued", detail="not looked at yet")
    doc = task_json(pb.ListResponse(tasks=[task], total=1))

    (shown,) = doc["tasks"]
    assert shown["created_ns"] == BIG and isinstance(shown["created_ns"], int)
    assert shown["started_ns"] == 0 and shown["output_dropped_bytes"] == 7
    assert shown["cpus"] == [0, 3] and shown["labels"] == {"app": "web"}
    assert shown["reasons"] == [{"kind": "Queued", "node": "", "detail": "not looked at yet"}]
    assert json.loads(json.dumps(doc))["tasks"][0]["created_ns"] == BIG
