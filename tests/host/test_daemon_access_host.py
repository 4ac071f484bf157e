"""Who may do what through a real agent's socket: real users (made and removed here), the
real CLI running as each of them, the kernel's word on who connected.

The socket is opened to everyone (what an operator does with the group, done with the
mode here): from there, only the agent's rules keep users apart."""

import grp
import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import closing
from pathlib import Path

import pytest

from xhagent.bench.local_agent import LocalAgent

pytestmark = pytest.mark.host

RUN_CLI = (
    "import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); "
    "sys.argv[0] = 'xhagent'; runpy.run_module('xhagent.cli', run_name='__main__')"
)


def _system(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def people():
    """Two users, a third in an admin group; their names, uids and gids."""
    tag = os.getpid() % 100000
    admins = f"xhadm{tag}"
    names = {"ann": f"xhann{tag}", "bob": f"xhbob{tag}", "cat": f"xhcat{tag}"}
    _system("groupadd", "--system", admins)
    made = []
    try:
        for name in names.values():
            _system("useradd", "--system", "--no-create-home", "--user-group", name)
            made.append(name)
        _system("usermod", "--append", "--groups", admins, names["cat"])
        yield {"admins": admins, **{k: pwd.getpwnam(v) for k, v in names.items()}}
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, timeout=60)
        subprocess.run(["groupdel", admins], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def python():
    """A python the test users may run (pyenv's lives under root's 0700 home)."""
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    for exe in (sys.executable, system):
        try:
            subprocess.run([exe, "-c", ""], user=65534, group=65534, check=True, timeout=60)
        except (OSError, subprocess.CalledProcessError):
            continue
        return exe
    pytest.skip(f"no python that other users may run (tried {sys.executable}, {system})")


class Agent(LocalAgent):
    def as_user(self, python, who, *args: str) -> subprocess.CompletedProcess:
        """`xhagent ARGS --socket S` as `who` (a pwd entry), or as root when None."""
        cmd = [*args, "--socket", str(self.socket)]
        if who is None:
            exe = Path(sys.executable).with_name("xhagent")
            return subprocess.run([str(exe), *cmd], capture_output=True, text=True, timeout=60)
        return subprocess.run(
            [python, "-S", "-c", RUN_CLI, sysconfig.get_paths()["platlib"], *cmd],
            user=who.pw_uid,
            group=who.pw_gid,
            extra_groups=os.getgrouplist(who.pw_name, who.pw_gid),
            env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def agent(people):
    base = Path(tempfile.mkdtemp(prefix="xhagent-access-"))
    os.chmod(base, 0o755)
    a = Agent(base, f"xhagent-access-test-{os.getpid()}.slice",
              extra=("--admin-group", people["admins"], "--max-streams", "3"))  # fmt: skip
    a.start()
    os.chmod(a.socket.parent, 0o755)
    os.chmod(a.socket, 0o666)
    yield a
    a.stop()
    a.remove_subtree()
    shutil.rmtree(base)


def _task(tmp: Path, name: str, command: list[str], user: str | None = None) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(
        "apiVersion: xh.scheduling/v1\nkind: Task\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  deviceType: cpu\n  command: {json.dumps(command)}\n"
        + (f"  user: {json.dumps(user)}\n" if user else "")
    )
    os.chmod(path, 0o644)
    return path


def _wait(agent, python, who, task_id: str, timeout: float = 20.0) -> dict:
    end = time.monotonic() + timeout
    while True:
        res = agent.as_user(python, who, "get", task_id, "--json")
        assert res.returncode == 0, res.stderr
        task = json.loads(res.stdout)
        if task["state"] in ("Succeeded", "Failed", "Cancelled") or time.monotonic() > end:
            return task
        time.sleep(0.1)


def _output(agent, python, who, task_id: str) -> str:
    res = agent.as_user(python, who, "logs", task_id)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _submit(agent, python, who, path: Path) -> str:
    res = agent.as_user(python, who, "submit", str(path), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)[0]["id"]


def _events(agent, python, who) -> list[dict]:
    res = agent.as_user(python, who, "events", "--json")
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def _denials(agent) -> list[dict]:
    return [e for e in _events(agent, None, None) if e["kind"] == "PermissionDenied"]


def test_a_users_task_runs_as_itself_and_may_not_run_as_another(agent, python, people, tmp_path):
    ann, bob = people["ann"], people["bob"]
    task_id = _submit(agent, python, ann, _task(agent.base, "mine", ["sh", "-c", "id -u; id -g"]))
    done = _wait(agent, python, ann, task_id)
    assert (done["state"], done["owner_uid"]) == ("Succeeded", ann.pw_uid)
    assert _output(agent, python, ann, task_id) == f"{ann.pw_uid}\n{ann.pw_gid}\n"

    for user in ("root", "0", bob.pw_name, f"{ann.pw_name}:root"):
        path = _task(agent.base, "escalate", ["sh", "-c", "head -1 /etc/shadow"], user=user)
        res = agent.as_user(python, ann, "submit", str(path))
        assert res.returncode == 1, (user, res.stdout, res.stderr)
        assert f"uid {ann.pw_uid} (pid " in res.stderr and "Traceback" not in res.stderr
    # naming itself is allowed, and runs as itself
    path = _task(agent.base, "named", ["id", "-u"], user=ann.pw_name)
    assert _output(agent, python, ann, _wait_id(agent, python, ann, path)) == f"{ann.pw_uid}\n"

    denied = _denials(agent)
    assert len(denied) == 4
    assert {d["detail"]["uid"] for d in denied} == {ann.pw_uid}
    assert all(d["detail"]["rpc"] == "Submit" for d in denied)


def _wait_id(agent, python, who, path: Path) -> str:
    task_id = _submit(agent, python, who, path)
    assert _wait(agent, python, who, task_id)["state"] == "Succeeded"
    return task_id


def test_users_see_and_cancel_only_their_own_tasks(agent, python, people):
    ann, bob = people["ann"], people["bob"]
    roots = _submit(agent, python, None, _task(agent.base, "roots", ["sleep", "60"]))
    anns = _submit(agent, python, ann, _task(agent.base, "anns", ["sleep", "60"]))

    listed = agent.as_user(python, ann, "ps", "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [t["id"] for t in json.loads(listed.stdout)["tasks"]] == [anns]
    for verb in (("get", roots), ("cancel", roots), ("logs", roots), ("explain", roots)):
        res = agent.as_user(python, bob if verb[1] == anns else ann, *verb)
        assert res.returncode == 1 and f"no task {roots}" in res.stderr, (verb, res.stderr)
    res = agent.as_user(python, bob, "cancel", anns)
    assert res.returncode == 1 and f"no task {anns}" in res.stderr

    assert {e["task_id"] for e in _events(agent, python, ann)} == {anns}

    assert agent.as_user(python, ann, "cancel", anns).returncode == 0
    everything = json.loads(agent.as_user(None, None, "ps", "--all", "--json").stdout)
    assert {t["id"] for t in everything["tasks"]} == {roots, anns}
    assert json.loads(listed.stdout)["total"] == 1  # a user's count is of its own tasks
    assert agent.as_user(None, None, "cancel", roots).returncode == 0


def test_an_unreadable_row_is_told_to_its_owner_and_to_others_is_no_task(agent, python, people):
    ann, bob = people["ann"], people["bob"]
    anns = _wait_id(agent, python, ann, _task(agent.base, "anns", ["true"]))
    with closing(sqlite3.connect(agent.state / "state.db")) as db:  # bits lost on disk
        db.execute("UPDATE tasks SET spec = '{not json' WHERE id = ?", (anns,))
        db.commit()
    unreadable = f"task {anns}: its stored row is unreadable: column spec: not JSON"
    for who in (ann, None):  # its owner, and root
        res = agent.as_user(python, who, "get", anns)
        assert res.returncode == 1 and unreadable in res.stderr, res.stderr
    for verb in ("get", "cancel", "logs", "explain"):  # to another it does not exist
        res = agent.as_user(python, bob, verb, anns)
        assert res.returncode == 1 and res.stderr.strip() == f"xhagent: no task {anns}", res.stderr


def test_policies_and_tasks_as_anyone_are_for_admins(agent, python, people, tmp_path):
    ann, cat = people["ann"], people["cat"]
    policy = agent.base / "policy.yaml"
    policy.write_text(
        "apiVersion: xh.scheduling/v1\nkind: SchedulingPolicy\nmetadata: {name: p1}\n"
        "spec:\n  matchRules: [{selector: {matchLabels: {team: a}}}]\n  priority: 70\n"
    )
    os.chmod(policy, 0o644)
    res = agent.as_user(python, ann, "apply", "-f", str(policy))
    assert res.returncode == 1 and "for admins only" in res.stderr, res.stderr
    res = agent.as_user(python, ann, "delete", "policy", "p1")
    assert res.returncode == 1 and "for admins only" in res.stderr, res.stderr

    res = agent.as_user(python, cat, "apply", "-f", str(policy))
    assert res.returncode == 0, res.stderr
    # an admin's task without `user` runs as the agent's user, one with `user` as that user
    task_id = _wait_id(agent, python, cat, _task(agent.base, "as-agent", ["id", "-u"]))
    assert _output(agent, python, cat, task_id) == "0\n"
    path = _task(agent.base, "as-ann", ["id", "-u"], user=ann.pw_name)
    assert _output(agent, python, cat, _wait_id(agent, python, cat, path)) == f"{ann.pw_uid}\n"
    assert grp.getgrnam(people["admins"]).gr_mem == [cat.pw_name]


def test_a_caller_past_its_stream_bound_is_refused_and_others_are_not(agent, python, people):
    from xhagent.daemon.api.v1 import agent_pb2 as pb

    with agent.client() as client:
        streams = [client.Watch(pb.WatchRequest(follow=True)) for _ in range(3)]
        time.sleep(0.5)
        with pytest.raises(Exception) as err:
            next(client.Watch(pb.WatchRequest(follow=True)))
        assert getattr(err.value, "code", "") == "RESOURCE_EXHAUSTED", err.value
        assert "the most a caller may" in str(err.value)
        # another caller is not held to root's count
        res = agent.as_user(python, people["ann"], "events")
        assert res.returncode == 0, res.stderr
        for s in streams:
            s.close()
    time.sleep(0.5)
    with agent.client() as client:
        assert client.Health(pb.HealthRequest()).status
