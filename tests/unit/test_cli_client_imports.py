"""A client command loads what a client needs: click, grpc and the generated messages, not
the daemon's store (sqlite3), the spec readers (yaml) or the server side of the transport.
`xhagent ps` is a process a user starts again and again; every module it loads is paid on
each start (docs/benchmarks.md, `ps`: the floor).

Each command runs in a fresh interpreter against a socket nothing listens on: all of its
path but the call itself.
"""

import json
import subprocess
import sys

import pytest

# What no client command but submit and apply (which read a spec file) may load; secrets
# (hashlib, random) only submit's idempotency key needs.
HEAVY = (
    "secrets",
    "yaml",
    "sqlite3",
    "xhagent.spec",
    "xhagent.daemon.store",
    "xhagent.daemon.api.transport",
    "xhagent.daemon.api.request_checks",
    "xhagent.daemon.api.peers",
    "xhagent.daemon.api.service",
)
COMMANDS = [
    ["ps"],
    ["ps", "--all", "--json"],
    ["get", "t000001"],
    ["cancel", "t000001"],
    ["logs", "t000001"],
    ["events", "--since", "3"],
    ["explain", "t000001"],
    ["delete", "policy", "p1"],
]


def loaded_by(argv: list[str], socket: str) -> tuple[int, str, list[str]]:
    """The exit status, standard error and the modules a fresh interpreter holds after
    `xhagent ARGV --socket SOCKET`."""
    code = f"""
import json, sys
from xhagent.cli import main
sys.argv = ["xhagent", *{argv!r}, "--socket", {socket!r}]
try:
    main()
finally:
    print(json.dumps(sorted(sys.modules)), file=sys.__stdout__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return out.returncode, out.stderr, json.loads(out.stdout.splitlines()[-1])


def heavy(names: list[str]) -> list[str]:
    return [n for n in names if n in HEAVY or n.startswith(tuple(h + "." for h in HEAVY))]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_client_command_loads_no_store_spec_or_server(argv, tmp_path):
    status, err, loaded = loaded_by(argv, str(tmp_path / "none.sock"))
    # it got as far as connecting, where no agent answers
    assert status == 1 and "no agent at" in err, err
    assert "grpc" in loaded and "xhagent.daemon.api.v1.agent_pb2" in loaded
    assert heavy(loaded) == []


def test_the_check_sees_a_heavy_import(tmp_path):
    # The probe itself: submit reads its file with the spec readers, which load yaml.
    task = tmp_path / "t.yaml"
    task.write_text("kind: Task\n")
    status, err, loaded = loaded_by(["submit", str(task)], str(tmp_path / "none.sock"))
    assert status == 1 and "no agent at" in err, err
    assert {"yaml", "xhagent.spec"} <= set(heavy(loaded))
