"""Every request field out of its range is INVALID_ARGUMENT naming the field, before any
method acts; bytes that are not UTF-8 name their field too; an unexpected exception in a
method is INTERNAL in one line and counted as the agent's `api` internal error. Over a real
unix socket, through the real transport and the real AgentService (no scheduler: nothing
out of range gets as far as needing one)."""

import contextlib
import re
from types import SimpleNamespace

import grpc
import pytest

from xhagent.daemon.api import request_checks
from xhagent.daemon.api.client import ApiError, connect
from xhagent.daemon.api.service import AgentService
from xhagent.daemon.api.transport import bind, unary
from xhagent.daemon.api.v1 import agent_pb2 as pb
from xhagent.daemon.loop.faults import Faults

BIG = 2**64 - 1
# (method, request, the start of the details): one per field with a range
OUT_OF_RANGE = [
    ("Watch", pb.WatchRequest(since_seq=2**63), "since_seq: at most 9223372036854775807"),
    ("Watch", pb.WatchRequest(since_seq=BIG), "since_seq: at most"),
    ("Watch", pb.WatchRequest(task_id="t" * 65), "task_id: at most 64 bytes"),
    ("Watch", pb.WatchRequest(task_id="t\x1b[2J"), "task_id: must be printable"),
    ("Logs", pb.LogsRequest(id="t1", offset=BIG), "offset: at most 4611686018427387904"),
    ("Logs", pb.LogsRequest(id="t1", stream=7), "stream: 7 is not one of"),
    ("Logs", pb.LogsRequest(id="t1", tail_lines=2**32 - 1), "tail_lines: at most 1000000"),
    ("Logs", pb.LogsRequest(id="t1", since_ns=-1), "since_ns: at least 0"),
    ("Logs", pb.LogsRequest(), "id: must not be empty"),
    ("List", pb.ListRequest(states=["Pending"] * 400_000), "states: at most 7 (this request"),
    ("List", pb.ListRequest(states=["Bogus"]), "states: 'Bogus' is not a state"),
    ("List", pb.ListRequest(page_token="t" * 65), "page_token: at most 64 bytes"),
    ("Get", pb.GetRequest(), "id: must not be empty"),
    ("Get", pb.GetRequest(id="x" * 10_000), "id: at most 64 bytes (this one has 10000)"),
    ("Get", pb.GetRequest(id="a\x00b"), "id: must be printable"),
    ("Cancel", pb.CancelRequest(id="t1", reason="r" * 5000), "reason: at most 4096 bytes"),
    ("Explain", pb.ExplainRequest(id=""), "id: must not be empty"),
    ("Cancel", pb.CancelRequest(id="t1\n"), "id: must be printable"),
    ("Submit", pb.SubmitRequest(idempotency_key="k" * 254), "idempotency_key: at most 253 bytes"),
    ("Submit", pb.SubmitRequest(file_name="f" * 5000), "file_name: at most 4096 bytes"),
    ("Submit", pb.SubmitRequest(source="x" * (4 << 20) + "x"), "source: at most 4194304 bytes"),
    ("ApplyPolicy", pb.ApplyPolicyRequest(file_name="f" * 5000), "file_name: at most 4096"),
    ("ApplyPolicy", pb.ApplyPolicyRequest(source="é" * (2 << 20) + "x"), "source: at most"),
    ("RemovePolicy", pb.RemovePolicyRequest(kind="Task", name="p"), "kind: 'Task' is not one of"),
    ("RemovePolicy", pb.RemovePolicyRequest(kind="CgroupPolicy"), "name: must not be empty"),
]


@contextlib.contextmanager
def serving(service, sock):
    server = bind(service, sock, group="xhagent-test-no-such-group")
    try:
        with connect(sock, timeout=10) as client:
            yield client
    finally:
        server.stop(None)
        service.close()


# The checks answer before any method runs: a scheduler that is never asked suffices.
NO_SCHEDULER = SimpleNamespace(on_change=lambda listener: None)


@pytest.fixture
def served(tmp_path):
    service, sock = AgentService(NO_SCHEDULER, None, {}, Faults()), tmp_path / "run" / "agent.sock"
    with serving(service, sock) as client:
        yield service, client, sock


@pytest.mark.parametrize(("method", "request_", "details"), OUT_OF_RANGE)
def test_a_field_out_of_range_is_invalid_argument_naming_it(served, method, request_, details):
    _, client, _ = served
    with pytest.raises(ApiError) as err:
        reply = getattr(client, method)(request_)
        list(reply) if method in ("Watch", "Logs") else reply
    assert err.value.code == "INVALID_ARGUMENT", err.value
    assert str(err.value).startswith(details), str(err.value)
    assert err.value.exit_code == 2
    assert "<class" not in str(err.value) and "Error" not in str(err.value)


def test_every_field_with_a_range_is_in_the_table_above():
    covered = {(type(r).__name__, d.split(":")[0]) for _, r, d in OUT_OF_RANGE}
    table = {
        (t.__name__, name) for t, fields in request_checks.FIELDS.items() for name, _ in fields
    }
    assert table <= covered, sorted(table - covered)


def test_every_problem_of_a_request_is_listed_one_line_each():
    request = pb.LogsRequest(id="", stream=9, offset=BIG)
    assert [p.split(":")[0] for p in request_checks.problems(request)] == [
        "id",
        "stream",
        "offset",
    ]
    assert request_checks.problems(pb.LogsRequest(id="t0000001", offset=2**62)) == []
    assert request_checks.problems(pb.WatchRequest(since_seq=2**63 - 1, task_id="")) == []


@pytest.mark.parametrize(
    ("method", "field_number", "name"),
    [("Get", 1, "id"), ("Submit", 3, "idempotency_key"), ("List", 2, "states")],
)
def test_bytes_that_are_not_utf8_name_their_field(served, method, field_number, name):
    _, _, sock = served
    body = bytes([field_number << 3 | 2, 3]) + b"\xff\xfeA"
    with grpc.insecure_channel(f"unix:{sock}") as channel:
        call = channel.unary_unary(f"/xhagent.v1.Agent/{method}")
        with pytest.raises(grpc.RpcError) as err:
            call(body, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == f"{name}: not valid UTF-8"


def test_an_unexpected_exception_is_internal_in_one_line_and_counted(tmp_path, caplog):
    service = AgentService(NO_SCHEDULER, None, {}, Faults())
    service.Get = unary(lambda self, request, peer: {}["no-such-key"]).__get__(service)
    assert service.faults.totals()["api"] == 0
    with serving(service, tmp_path / "run" / "agent.sock") as client:
        for _ in range(3):
            with pytest.raises(ApiError) as err:
                client.Get(pb.GetRequest(id="t0000001"))
            assert err.value.code == "INTERNAL"
            assert str(err.value) == (
                "internal error in Get: 'no-such-key' (the agent's log has the details)"
            )
    assert service.faults.totals()["api"] == 3
    # the traceback once, then one line per time
    assert sum(1 for r in caplog.records if r.exc_info) == 1, caplog.text
    assert (
        len(
            [
                r
                for r in caplog.records
                if "internal error in api: Get: 'no-such-key'" in r.getMessage()
            ]
        )
        == 3
    )
    assert not re.search(r"<class|Unexpected", caplog.text)
