"""`xhagent submit` sends an idempotency key by default and tries again with that same key
when no reply came, so a lost reply makes no duplicate task."""

import pytest
from click.testing import CliRunner

from xhagent.daemon.api import cli
from xhagent.daemon.api.client import ApiError
from xhagent.daemon.api.v1 import agent_pb2 as pb


class Flaky:
    """A client whose first `lost` Submits fail as if their replies were lost."""

    def __init__(self, lost: int, code: str = "UNAVAILABLE"):
        self.lost, self.code = lost, code
        self.requests: list[pb.SubmitRequest] = []

    def Submit(self, request):
        self.requests.append(request)
        if self.lost > 0:
            self.lost -= 1
            raise ApiError(self.code, "connection reset")
        return pb.SubmitResponse(tasks=[pb.Task(id="t1", name="a", state="Pending")])


def test_the_same_key_is_sent_on_every_retry_with_a_growing_backoff():
    client, slept = Flaky(lost=2), []
    request = pb.SubmitRequest(source="x", idempotency_key=cli.submit_key("", "a.yaml"))
    reply = cli.submit_with_retry(client, request, sleep=slept.append)
    assert [t.id for t in reply.tasks] == ["t1"]
    keys = {r.idempotency_key for r in client.requests}
    assert len(client.requests) == 3 and keys == {request.idempotency_key}
    assert slept == [cli.SUBMIT_BACKOFF_S, 2 * cli.SUBMIT_BACKOFF_S]


@pytest.mark.parametrize("code", ["UNAVAILABLE", "DEADLINE_EXCEEDED"])
def test_the_tries_are_bounded(code):
    client = Flaky(lost=10, code=code)
    with pytest.raises(ApiError) as caught:
        cli.submit_with_retry(client, pb.SubmitRequest(idempotency_key="k"), sleep=lambda s: None)
    assert caught.value.code == code and len(client.requests) == cli.SUBMIT_TRIES


def test_an_answer_is_not_retried():
    client = Flaky(lost=1, code="INVALID_ARGUMENT")
    with pytest.raises(ApiError):
        cli.submit_with_retry(client, pb.SubmitRequest(idempotency_key="k"), sleep=lambda s: None)
    assert len(client.requests) == 1


def test_each_file_of_each_run_gets_a_fresh_key_and_key_overrides(tmp_path, monkeypatch):
    client = Flaky(lost=1)
    monkeypatch.setattr(cli, "_client", lambda socket_path: client)
    monkeypatch.setattr(cli, "SUBMIT_BACKOFF_S", 0.0)
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text("kind: Task\n")
    files = [str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]
    for _ in range(2):
        res = CliRunner().invoke(cli.submit, files)
        assert res.exit_code == 0, res.output
    keys = [r.idempotency_key for r in client.requests]
    assert len(keys) == 5  # a.yaml tried twice in the first run, then once each
    assert keys[0] == keys[1] and len(set(keys)) == 4
    assert all(k.startswith("submit-") and len(k) == len("submit-") + 32 for k in keys)
    client.requests.clear()
    assert CliRunner().invoke(cli.submit, [files[0], "--key", "job7"]).exit_code == 0
    assert [r.idempotency_key for r in client.requests] == [f"job7:{files[0]}"]
