"""The gRPC plumbing over a real unix socket with real grpcio: bind's safety rules, the
client's errors, status codes and streams. Runs as any user; the group and the `nobody`
client are in tests/host/test_daemon_api_host.py."""

import asyncio
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from xhagent.daemon.api import transport as api
from xhagent.daemon.api.client import AgentUnavailable, ApiError, connect, resolve_socket
from xhagent.daemon.api.transport import BindError, bind
from xhagent.daemon.api.v1 import agent_pb2 as pb
from xhagent.daemon.api.v1 import agent_pb2_grpc as pb_grpc

NO_GROUP = "xhagent-test-no-such-group"


class Servicer(pb_grpc.AgentServicer):
    def __init__(self):
        self.stream_ended = threading.Event()
        self.executor = ThreadPoolExecutor(4)

    @api.unary
    def Health(self, request, peer):
        caller = self.identify(peer)
        return pb.HealthResponse(
            status="ok", pid=os.getpid(), version="test", socket=str(caller) if caller else ""
        )

    @api.unary
    def Submit(self, request, peer):
        raise api.InvalidArgument(f"{request.file_name}:3:7: spec.priority: must be 0..100")

    @api.unary
    def Cancel(self, request, peer):
        raise api.FailedPrecondition(f"task {request.id} already ended (Succeeded)")

    @api.unary
    def Get(self, request, peer):
        raise api.NotFound(f"no task {request.id}")

    @api.unary
    def ApplyPolicy(self, request, peer):
        raise api.InvalidArgument(request.source)

    async def Watch(self, request, context):
        try:
            for seq in range(1, 4):
                yield pb.Event(seq=seq, kind="started", task_id=request.task_id)
            while request.since_seq == 99:  # a stream that never ends by itself
                await asyncio.sleep(0.01)
                yield pb.Event(seq=0, kind="tick")
        finally:
            self.stream_ended.set()


@pytest.fixture
def sock(tmp_path):
    return tmp_path / "run" / "xhagent.sock"


@pytest.fixture
def served(sock):
    servicer = Servicer()
    server = bind(servicer, sock, group=NO_GROUP)
    yield servicer
    server.stop(None)


def test_resolve_socket_option_then_env_then_default(monkeypatch):
    monkeypatch.delenv("XHAGENT_SOCKET", raising=False)
    assert resolve_socket(None) == Path("/run/xhagent/xhagent.sock")
    monkeypatch.setenv("XHAGENT_SOCKET", "/tmp/env.sock")
    assert resolve_socket(None) == Path("/tmp/env.sock")
    assert resolve_socket("/tmp/opt.sock") == Path("/tmp/opt.sock")


def test_round_trip_over_the_socket(sock, served):
    with connect(sock) as client:
        health = client.Health(pb.HealthRequest())
    assert (health.status, health.pid, health.version) == ("ok", os.getpid(), "test")


def test_modes_without_the_group_are_root_only(sock, served):
    assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o750
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600


def test_existing_directory_keeps_its_mode(sock):
    sock.parent.mkdir(mode=0o700)
    os.chmod(sock.parent, 0o700)
    server = bind(Servicer(), sock, group=NO_GROUP)
    try:
        assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o700
    finally:
        server.stop(None)


def test_directory_writable_by_others_is_refused(sock):
    sock.parent.mkdir()
    os.chmod(sock.parent, 0o1777)
    with pytest.raises(BindError, match=r"writable by others \(mode 1777\)"):
        bind(Servicer(), sock, group=NO_GROUP)
    assert not sock.exists()


def test_second_bind_is_refused_and_the_first_still_serves(sock, served):
    with pytest.raises(BindError) as err:
        bind(Servicer(), sock, group=NO_GROUP)
    assert str(err.value) == f"another agent serves at {sock} (pid {os.getpid()})"
    with connect(sock) as client:
        assert client.Health(pb.HealthRequest()).status == "ok"


def test_stale_socket_is_replaced(sock):
    sock.parent.mkdir(mode=0o750)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.bind(str(sock))  # bound, never listening, closed without unlink: a dead agent's
    raw.close()
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    server = bind(Servicer(), sock, group=NO_GROUP)
    try:
        with connect(sock) as client:
            assert client.Health(pb.HealthRequest()).status == "ok"
    finally:
        server.stop(None)


CHILD_AGENT = """
import sys, time
from xhagent.daemon.api.transport import bind
from xhagent.daemon.api.v1 import agent_pb2_grpc
bind(agent_pb2_grpc.AgentServicer(), sys.argv[1], group=sys.argv[2])
print("serving", flush=True)
time.sleep(60)
"""


def test_a_killed_agents_socket_names_its_pid_then_is_replaced(sock):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_AGENT, str(sock), NO_GROUP], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "serving\n"
        with pytest.raises(BindError, match=rf"another agent serves at .* \(pid {child.pid}\)"):
            bind(Servicer(), sock, group=NO_GROUP)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)  # SIGKILL left it behind
    server = bind(Servicer(), sock, group=NO_GROUP)
    try:
        with connect(sock) as client:
            assert client.Health(pb.HealthRequest()).pid == os.getpid()
    finally:
        server.stop(None)


@pytest.mark.parametrize("kind", ["file", "symlink", "directory"])
def test_other_kinds_of_file_are_refused_and_left_alone(sock, kind):
    sock.parent.mkdir(mode=0o750)
    if kind == "file":
        sock.write_text("precious\n")
    elif kind == "symlink":
        sock.symlink_to("/nonexistent")
    else:
        sock.mkdir()
    before = os.lstat(sock)
    with pytest.raises(BindError, match="exists and is not a socket: remove it or choose"):
        bind(Servicer(), sock, group=NO_GROUP)
    after = os.lstat(sock)
    assert (after.st_ino, after.st_mode, after.st_mtime_ns) == (
        before.st_ino,
        before.st_mode,
        before.st_mtime_ns,
    )
    if kind == "file":
        assert sock.read_text() == "precious\n"


def test_too_long_a_path_is_refused(tmp_path):
    with pytest.raises(BindError, match="at most 107 bytes"):
        bind(Servicer(), tmp_path / ("x" * 120) / "s.sock", group=NO_GROUP)


def test_connect_to_a_missing_socket(tmp_path):
    path = tmp_path / "none" / "xhagent.sock"
    with pytest.raises(AgentUnavailable) as err:
        connect(path)
    assert str(err.value) == f"no agent at {path}: start it with `xhagent run`"
    assert (err.value.code, err.value.exit_code) == ("UNAVAILABLE", 1)


def test_an_agent_that_went_away_is_unavailable(sock):
    server = bind(Servicer(), sock, group=NO_GROUP)
    client = connect(sock)
    server.stop(None)
    with pytest.raises(AgentUnavailable, match=f"no agent at {sock}: start it"):
        client.Health(pb.HealthRequest())
    client.close()


def test_invalid_argument_is_an_api_error_with_code_details_and_exit_2(sock, served):
    with connect(sock) as client, pytest.raises(ApiError) as err:
        client.Submit(pb.SubmitRequest(source="kind: Task\n", file_name="job.yaml"))
    assert err.value.code == "INVALID_ARGUMENT"
    assert str(err.value) == err.value.details == "job.yaml:3:7: spec.priority: must be 0..100"
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    ("rpc", "request_", "code", "details"),
    [
        ("Cancel", pb.CancelRequest(id="t-1"), "FAILED_PRECONDITION", "task t-1 already ended"),
        ("Get", pb.GetRequest(id="t-9"), "NOT_FOUND", "no task t-9"),
        ("Inventory", pb.InventoryRequest(), "UNIMPLEMENTED", "Method not implemented!"),
    ],
)
def test_refusals_exit_1(sock, served, rpc, request_, code, details):
    with connect(sock) as client, pytest.raises(ApiError) as err:
        getattr(client, rpc)(request_)
    assert (err.value.code, err.value.exit_code) == (code, 1)
    assert details in str(err.value)


def test_many_error_lines_are_cut_to_fit_a_header(sock, served):
    lines = [f"p.yaml:{n}:1: spec.matchRules.{n}.priority: must be 0..100" for n in range(1, 501)]
    with connect(sock) as client, pytest.raises(ApiError) as err:
        client.ApplyPolicy(pb.ApplyPolicyRequest(source="\n".join(lines)))
    got = str(err.value).split("\n")
    assert err.value.code == "INVALID_ARGUMENT"
    assert len("\n".join(got).encode()) <= api.MAX_DETAILS_BYTES
    assert got[:-1] == lines[: len(got) - 1]
    assert got[-1] == f"... {500 - (len(got) - 1)} more lines"


def test_stream_delivers_events_in_order(sock, served):
    with connect(sock) as client:
        events = list(client.Watch(pb.WatchRequest(task_id="t-1")))
    assert [(e.seq, e.kind, e.task_id) for e in events] == [
        (n, "started", "t-1") for n in (1, 2, 3)
    ]


def test_dropping_a_stream_ends_it_on_the_server(sock, served):
    with connect(sock) as client:
        events = client.Watch(pb.WatchRequest(since_seq=99))
        assert next(events).seq == 1
        events.close()
        assert served.stream_ended.wait(10)


def test_optional_fields_tell_absence_from_zero():
    task = pb.Task(id="t-1")
    assert not task.HasField("exit_code")
    task.exit_code = 0
    assert task.HasField("exit_code")
    assert not pb.WatchRequest().HasField("since_seq")
    assert pb.WatchRequest(since_seq=0).HasField("since_seq")


def test_message_limits_admit_a_4_mib_document(sock, served):
    with connect(sock) as client, pytest.raises(ApiError) as err:
        client.ApplyPolicy(pb.ApplyPolicyRequest(source="x" * (4 * 2**20), file_name="big.yaml"))
    # It reached the servicer (whose answer is the cut-down source), not a transport limit.
    assert err.value.code == "INVALID_ARGUMENT"


FORKING_AGENT = """
import os, sys
from xhagent.daemon.api.client import connect
from xhagent.daemon.api.transport import bind
from xhagent.daemon.api.v1 import agent_pb2 as pb, agent_pb2_grpc as pb_grpc
class Servicer(pb_grpc.AgentServicer):
    def Health(self, request, context):
        return pb.HealthResponse(status="ok")
server = bind(Servicer(), sys.argv[1], group=sys.argv[2])
with connect(sys.argv[1]) as client:
    client.Health(pb.HealthRequest())
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
server.stop(None)
"""


def test_an_agent_that_forks_logs_nothing_for_it(sock):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    run = subprocess.run(
        [sys.executable, "-c", FORKING_AGENT, str(sock), NO_GROUP],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stderr) == (0, "")


# -- the relay that tells the servicer who calls (api/peers.py) ----------------------------
@pytest.fixture
def server(tmp_path):
    server = bind(Servicer(), tmp_path / "run" / "xhagent.sock", group=NO_GROUP)
    yield server
    server.stop(None)


def test_a_call_knows_the_uid_and_pid_the_kernel_recorded(server, tmp_path):
    with connect(tmp_path / "run" / "xhagent.sock") as client:
        seen = client.Health(pb.HealthRequest()).socket
    assert seen == f"uid {os.getuid()} (pid {os.getpid()})"


def test_a_connection_around_the_public_socket_has_no_caller(server):
    with grpc.insecure_channel(f"unix-abstract:{server.relay.upstream}") as channel:
        reply = pb_grpc.AgentStub(channel).Health(pb.HealthRequest(), timeout=10)
    assert reply.status == "ok" and reply.socket == ""


def _until(predicate, timeout=10.0):
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "not within the timeout"
        time.sleep(0.02)


def test_a_closed_connection_is_forgotten(server, tmp_path):
    with connect(tmp_path / "run" / "xhagent.sock") as client:
        client.Health(pb.HealthRequest())
        assert server.relay.connections == 1
    _until(lambda: server.relay.connections == 0)


def test_connections_past_the_per_uid_bound_are_closed_at_once(server, tmp_path):
    path = os.fsencode(tmp_path / "run" / "xhagent.sock")
    held = []
    try:
        for _ in range(server.relay.per_uid):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            held.append(s)
        _until(lambda: server.relay.connections == server.relay.per_uid)
        extra = socket.socket(socket.AF_UNIX)
        extra.connect(path)  # the kernel accepts; the relay closes it
        extra.settimeout(10)
        assert extra.recv(1) == b""
        extra.close()
        assert server.relay.refused == 1
    finally:
        for s in held:
            s.close()
    _until(lambda: server.relay.connections == 0)
    with connect(tmp_path / "run" / "xhagent.sock") as client:
        assert client.Health(pb.HealthRequest()).status == "ok"


def test_stop_removes_its_socket_but_not_one_put_in_its_place(tmp_path):
    sock = tmp_path / "run" / "xhagent.sock"
    server = bind(Servicer(), sock, group=NO_GROUP)
    server.stop(None)
    assert not sock.exists()
    server = bind(Servicer(), sock, group=NO_GROUP)
    os.unlink(sock)
    sock.write_text("someone else's")
    server.stop(None)
    assert sock.read_text() == "someone else's"


def test_a_stream_of_many_megabytes_passes_the_relay_whole(tmp_path):
    class Big(Servicer):
        async def Watch(self, request, context):
            for seq in range(1, 65):
                yield pb.Event(seq=seq, message="x" * (1 << 20))

    sock = tmp_path / "run" / "xhagent.sock"
    server = bind(Big(), sock, group=NO_GROUP)
    try:
        with connect(sock) as client:
            events = list(client.Watch(pb.WatchRequest()))
        assert [e.seq for e in events] == list(range(1, 65))
        assert all(len(e.message) == 1 << 20 for e in events)
    finally:
        server.stop(None)


def test_a_refused_stream_is_its_status_not_a_hang(tmp_path):
    class Refusing(Servicer):
        async def Watch(self, request, context):
            raise api.ResourceExhausted("uid 1 holds 2 streams, the most a caller may")
            yield  # an async generator

    sock = tmp_path / "run" / "xhagent.sock"
    server = bind(Refusing(), sock, group=NO_GROUP)
    try:
        with connect(sock) as client, pytest.raises(ApiError) as err:
            list(client.Watch(pb.WatchRequest()))
        assert err.value.code == "RESOURCE_EXHAUSTED" and "most a caller may" in str(err.value)
    finally:
        server.stop(None)


def test_bytes_a_client_sends_before_grpcs_end_is_connected_are_held_not_lost(
    tmp_path, monkeypatch
):
    """As Debian 12's asyncio does (3.11.2): a transport reads after connection_made even
    when reading was paused there. With grpc's end slow to connect, the client's preface
    comes first; it must reach grpc whole."""
    import asyncio.selector_events as selector_events

    from xhagent.daemon.api.peers import PeerRelay

    def reads_whatever(self, fd, callback, *args):
        if self._closing:
            return
        self._loop._add_reader(fd, callback, *args)

    monkeypatch.setattr(selector_events._SelectorTransport, "_add_reader", reads_whatever)
    connect_upstream = PeerRelay._connect

    async def slowly(self, link):
        await asyncio.sleep(0.3)
        await connect_upstream(self, link)

    monkeypatch.setattr(PeerRelay, "_connect", slowly)
    sock = tmp_path / "run" / "xhagent.sock"
    server = bind(Servicer(), sock, group=NO_GROUP)
    try:
        with connect(sock) as client:
            assert client.Health(pb.HealthRequest()).status == "ok"
    finally:
        server.stop(None)


def test_every_call_is_counted_by_method_and_status_code(sock, tmp_path):
    from xhagent.daemon.metrics import AgentMetrics
    from xhagent.daemon.store import Store

    with Store.open(tmp_path / "state") as store:
        metrics = AgentMetrics(store, lambda: [])
        server = bind(Servicer(), sock, group=NO_GROUP, calls=metrics)
        try:
            with connect(sock) as client:
                client.Health(pb.HealthRequest())
                with pytest.raises(ApiError):
                    client.Get(pb.GetRequest(id="t1"))
                assert len(list(client.Watch(pb.WatchRequest()))) == 3
        finally:
            server.stop(None)

        def handled(method, kind, code):
            return metrics.registry.get_sample_value(
                "grpc_server_handled_total",
                {
                    "grpc_service": "xhagent.v1.Agent",
                    "grpc_method": method,
                    "grpc_type": kind,
                    "grpc_code": code,
                },
            )

        assert handled("Health", "unary", "OK") == 1
        assert handled("Get", "unary", "NOT_FOUND") == 1
        assert handled("Watch", "server_stream", "OK") == 1
        labels = {"grpc_service": "xhagent.v1.Agent", "grpc_method": "Get", "grpc_type": "unary"}
        assert metrics.registry.get_sample_value("grpc_server_started_total", labels) == 1
        assert metrics.registry.get_sample_value("grpc_server_handling_seconds_count", labels) == 1
