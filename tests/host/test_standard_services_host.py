"""A real `xhagent run` answers the standard gRPC services on its socket, as Kubernetes gRPC
probes, grpc_health_probe and grpcurl ask: grpc.health.v1 SERVING for the server and the
agent's service, reflection naming every service; `xhagent health` says the same and exits
0; after SIGTERM nothing answers and `xhagent health` exits 1."""

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from xhagent.bench.local_agent import LocalAgent

pytestmark = pytest.mark.host

XHAGENT = Path(sys.executable).with_name("xhagent")


def health_cli(sock: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(XHAGENT), "health", "--socket", str(sock), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_running_agent_serves_health_and_reflection(tmp_path):
    agent = LocalAgent(tmp_path, f"xhagent-standard-test-{os.getpid()}.slice")
    agent.start()
    try:
        with grpc.insecure_channel(f"unix:{agent.socket}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for name in ("", "xhagent.v1.Agent"):
                reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
            reflected = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            )
            names = {s.name for s in next(reflected).list_services_response.service}
            assert {"xhagent.v1.Agent", "grpc.health.v1.Health"} <= names

        res = health_cli(agent.socket, "--json")
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["serving"] is True and doc["status"] == "ok"
        assert doc["pid"] == agent.proc.pid and doc["socket"] == str(agent.socket)
        assert doc["metrics_url"].startswith("http://127.0.0.1:")
        assert health_cli(agent.socket).stdout.startswith("serving: ok")
    finally:
        agent.stop()
        agent.remove_subtree()
    gone = health_cli(agent.socket)
    assert gone.returncode == 1 and "no agent at" in gone.stderr


def test_the_shell_completes_task_ids_from_the_agent(tmp_path):
    agent = LocalAgent(tmp_path, f"xhagent-complete-test-{os.getpid()}.slice")
    agent.start()
    try:
        task = tmp_path / "t.yaml"
        task.write_text(
            "apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {name: done}\n"
            'spec:\n  deviceType: cpu\n  command: ["true"]\n'
        )
        sub = subprocess.run(
            [str(XHAGENT), "submit", str(task), "--socket", str(agent.socket)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        task_id = sub.stdout.split()[0]

        def complete(words: str) -> list[str]:
            env = dict(os.environ, _XHAGENT_COMPLETE="bash_complete", COMP_WORDS=words)
            env["COMP_CWORD"] = str(len(words.split()) - (0 if words.endswith(" ") else 1))
            res = subprocess.run(
                [str(XHAGENT)], env=env, capture_output=True, text=True, timeout=60
            )
            return [line.split(",", 1)[1] for line in res.stdout.splitlines() if line]

        assert task_id in complete(f"xhagent get --socket {agent.socket} {task_id[:3]}")
        assert complete(f"xhagent logs --socket {agent.socket} tzzz") == []
        assert complete(f"xhagent get --socket {tmp_path}/none.sock t") == []  # no agent
    finally:
        agent.stop()
        agent.remove_subtree()
