"""grpc.health.v1 and server reflection beside the agent's own service, over a real unix
socket with real grpcio and the packages' own client stubs: health follows what the agent
says fails, Watch sees the change, a stop is NOT_SERVING, reflection names and describes
every service, their streams are capped; `xhagent health` exits by the agent's status."""

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from xhagent.daemon.api import standard
from xhagent.daemon.api import transport as api
from xhagent.daemon.api.standard import AGENT_SERVICE, AgentHealth
from xhagent.daemon.api.transport import bind
from xhagent.daemon.api.v1 import agent_pb2 as pb
from xhagent.daemon.api.v1 import agent_pb2_grpc as pb_grpc

NO_GROUP = "xhagent-test-no-such-group"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Servicer(pb_grpc.AgentServicer):
    def __init__(self):
        self.trouble: str | None = None
        self.executor = ThreadPoolExecutor(2)

    @api.unary
    def Health(self, request, peer):
        return pb.HealthResponse(status=self.trouble or "ok", version="test", pid=os.getpid())


@pytest.fixture
def served(tmp_path):
    servicer = Servicer()
    agent_health = AgentHealth(lambda: servicer.trouble)
    sock = tmp_path / "run" / "xhagent.sock"
    server = bind(servicer, sock, group=NO_GROUP, health=agent_health)
    channel = grpc.insecure_channel(f"unix:{sock}")
    yield servicer, agent_health, channel, sock, server
    channel.close()
    server.stop(None)


def check(channel, name=""):
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status


def test_health_follows_what_fails_and_watch_sees_it(served):
    servicer, agent_health, channel, _, _ = served
    assert check(channel) == check(channel, AGENT_SERVICE) == SERVING
    with pytest.raises(grpc.RpcError) as err:
        check(channel, "no.such.Service")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    watch = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service=AGENT_SERVICE), timeout=10
    )
    assert next(watch).status == SERVING
    servicer.trouble = "loop: disk I/O error (1 time(s) since 12:00:00)"
    agent_health.changed()  # as the agent's loop does after each step
    assert next(watch).status == NOT_SERVING
    assert check(channel) == NOT_SERVING
    servicer.trouble = None
    agent_health.changed()
    assert next(watch).status == SERVING
    watch.cancel()


def test_check_is_exact_between_changes(served):
    servicer, _, channel, _, _ = served
    servicer.trouble = "state disk full"
    assert check(channel) == NOT_SERVING  # nobody called changed(): Check looks itself


def test_a_stop_is_not_serving_before_the_socket_goes(served):
    _, _, channel, _, server = served
    watch = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service=""), timeout=10
    )
    assert next(watch).status == SERVING
    stopper = threading.Thread(target=server.stop, args=(2.0,))
    stopper.start()
    assert next(watch).status == NOT_SERVING
    stopper.join()


def reflect(channel, **request):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(**request)]), timeout=5
    )
    return list(replies)[0]


def test_reflection_names_and_describes_every_service(served):
    channel = served[2]
    listed = reflect(channel, list_services="").list_services_response.service
    assert sorted(s.name for s in listed) == [
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        AGENT_SERVICE,
    ]
    reply = reflect(channel, file_containing_symbol=AGENT_SERVICE)
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in reply.file_descriptor_response.file_descriptor_proto
    ]
    agent = next(f for f in files if f.package == "xhagent.v1")
    methods = {m.name for s in agent.service for m in s.method}
    assert {"Submit", "List", "Health", "Watch", "Logs"} <= methods


def test_streams_past_the_cap_are_refused(served, monkeypatch):
    channel = served[2]
    monkeypatch.setattr(standard, "MAX_STREAMS", 2)
    stub = health_pb2_grpc.HealthStub(channel)
    open_ = [stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10) for _ in range(2)]
    for w in open_:
        assert next(w).status == SERVING
    with pytest.raises(grpc.RpcError) as err:
        next(stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "streams are open already" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        reflect(channel, list_services="")
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for w in open_:
        w.cancel()


def health_cli(sock, *args):
    return subprocess.run(
        [sys.executable, "-m", "xhagent.cli", "health", "--socket", str(sock), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_health_command_exits_by_the_status(served):
    import json

    servicer, _, _, sock, _ = served
    ok = health_cli(sock, "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert (doc["status"], doc["serving"], doc["pid"]) == ("ok", True, os.getpid())

    servicer.trouble = "loop: disk I/O error"
    bad = health_cli(sock)
    assert bad.returncode == 1
    assert bad.stdout.startswith("NOT SERVING: loop: disk I/O error")
    assert "Traceback" not in bad.stderr

    gone = health_cli(sock.parent / "none.sock")
    assert gone.returncode == 1 and "no agent at" in gone.stderr
