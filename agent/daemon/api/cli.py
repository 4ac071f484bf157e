"""`xhagent run` (the daemon) and its clients: submit, ps, get, cancel, logs, events, apply,
delete, explain.

Every client finds the agent at `--socket PATH`, else $XHAGENT_SOCKET, else
/run/xhagent/xhagent.sock. Exit status: 0 done; 1 refused or failed (no agent, a task
that already ended; `submit --wait`: a task did not succeed); 2 bad input (the agent's
FILE:LINE:COL errors).
"""

from __future__ import annotations

import codecs
import json
import sys
import time

import click

from ...cliparams import InputFile, Text, shown_path
from .limits import INT64_MAX, MAX_ID, MAX_NAME, MAX_TAIL_LINES


class TaskId(Text):
    """A task id; the shell completes it from the agent's tasks (newest first), asked over
    the socket the command line names so far; nothing when no agent answers in a second."""

    name = "task_id"
    COMPLETE_TIMEOUT_S = 1.0

    def shell_complete(self, ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        from .client import ApiError, connect, resolve_socket
        from .v1 import agent_pb2 as pb

        try:
            where = resolve_socket(ctx.params.get("socket_path"))
            with connect(where, timeout=self.COMPLETE_TIMEOUT_S) as client:
                tasks = client.List(pb.ListRequest(all=True, limit=1000)).tasks
        except (ApiError, OSError):
            return []
        return [
            CompletionItem(t.id, help=f"{t.name} {t.state}")
            for t in tasks
            if t.id.startswith(incomplete)
        ]


TASK_ID = TaskId(MAX_ID, printable=True, required=True)


class Since(click.ParamType):
    """A duration back from now (`30s`, `5m`, `1h30m`) or an RFC 3339 time
    (`2026-12-04T18:00:00Z`) -> ns since the epoch (CLOCK_REALTIME)."""

    name = "since"

    def convert(self, value, param, ctx) -> int:
        from ...policy.units import parse_duration_ns, parse_instant_ns

        if isinstance(value, int):
            return value
        try:
            if value[:4].isdigit() and "-" in value:
                return parse_instant_ns(value)
            return max(0, time.time_ns() - parse_duration_ns(value))
        except ValueError:
            self.fail(
                f"{value!r} is neither a duration (30s, 5m, 1h30m) nor an RFC 3339 time "
                "(2026-12-04T18:00:00Z)",
                param,
                ctx,
            )


UTF8 = codecs.getincrementaldecoder("utf-8")


def fail(message: str, code: int = 1):
    click.echo(f"xhagent: {message}", err=True)
    sys.exit(code)


def socket_option(fn):
    return click.option(
        "--socket",
        "socket_path",
        default=None,
        metavar="PATH",
        help="The agent's socket [default: $XHAGENT_SOCKET, else /run/xhagent/xhagent.sock].",
    )(fn)


def _client(socket_path: str | None):
    from .client import ApiError, connect, resolve_socket

    try:
        return connect(resolve_socket(socket_path))
    except ApiError as exc:
        fail(str(exc), exc.exit_code)


def _call(fn, *args, **kw):
    from .client import ApiError

    try:
        return fn(*args, **kw)
    except ApiError as exc:
        fail(str(exc), exc.exit_code)


def _pb():
    from .v1 import agent_pb2

    return agent_pb2


def task_json(msg) -> dict:
    """A message as JSON with the proto's field names, every field shown, and 64-bit
    integers as numbers: protobuf's JSON mapping writes them as strings (for JavaScript's
    doubles), but a script reading `created_ns` wants a number, as jq and Python read it."""
    from google.protobuf.json_format import MessageToDict

    doc = MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _numbers(msg.DESCRIPTOR, doc)


def _numbers(descriptor, doc: dict) -> dict:
    from google.protobuf.descriptor import FieldDescriptor as F

    wide = {F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64}
    for field in descriptor.fields:
        value = doc.get(field.name)
        if value is None:
            continue
        if field.type in wide:
            doc[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.type == F.TYPE_MESSAGE and not field.message_type.GetOptions().map_entry:
            for item in value if isinstance(value, list) else [value]:
                _numbers(field.message_type, item)
    return doc


# A Submit whose reply was lost may have made its tasks: it is sent again with the same
# idempotency key, so the agent answers with those tasks instead of making new ones.
SUBMIT_TRIES = 3
SUBMIT_BACKOFF_S = 0.5  # before the second try; doubled before each next one
NO_REPLY = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def submit_key(key: str, file_name: str) -> str:
    """The idempotency key of one file's Submit: `--key`'s, else a fresh random one."""
    import secrets  # hashlib, random: only submit pays for them

    return f"{key}:{file_name}" if key else f"submit-{secrets.token_hex(16)}"


def submit_with_retry(client, request, sleep=time.sleep):
    """`client.Submit(request)`, tried again while no reply came (up to SUBMIT_TRIES in
    all); `request` carries its idempotency key, the same each time."""
    from .client import ApiError

    for attempt in range(SUBMIT_TRIES - 1):
        try:
            return client.Submit(request)
        except ApiError as exc:
            if exc.code not in NO_REPLY:
                raise
        sleep(SUBMIT_BACKOFF_S * 2**attempt)
    return client.Submit(request)


# -- clients -----------------------------------------------------------------------------------
@click.command()
@click.argument("files", nargs=-1, required=True, type=InputFile())
@click.option(
    "--wait",
    is_flag=True,
    help="Wait until every task ended, print each as it ends, and exit with the task's own "
    "status (several: the first non-zero one in submission order; 128+N for signal N).",
)
@click.option(
    "--key",
    default="",
    type=Text(MAX_NAME),
    help="Idempotency key: submitting again with it makes no duplicate [default: a fresh "
    "random one per file, kept across this command's own retries].",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@socket_option
def submit(files, wait, key, as_json, socket_path) -> None:
    """Submit the Task documents of FILES ('-' for standard input)."""
    from ...spec import SpecError, read_text

    pb = _pb()
    client = _client(socket_path)
    tasks = []
    for name in files:
        try:
            source = read_text(name)
        except SpecError as exc:
            fail(str(exc), 2)
        name = shown_path(name)
        each_key = submit_key(key, name)
        if len(each_key.encode()) > MAX_NAME:  # the agent keeps keys of at most MAX_NAME
            fail(f"--key: with the file name {name} the key has more than {MAX_NAME} bytes", 2)
        request = pb.SubmitRequest(source=source, file_name=name, idempotency_key=each_key)
        reply = _call(submit_with_retry, client, request)
        tasks += reply.tasks
    if wait:
        tasks = _wait_ended(client, tasks, None if as_json else _echo_ended)
    elif not as_json:
        for t in tasks:
            click.echo(f"{t.id} {t.name} {t.state}")
    if as_json:
        click.echo(json.dumps([task_json(t) for t in tasks], indent=2))
    if wait:
        sys.exit(next((s for s in map(exit_status, tasks) if s), 0))


def _echo_ended(t) -> None:
    click.echo(f"{t.id} {t.name} {t.state}{_outcome(t)}")


ENDED = ("Succeeded", "Failed", "Cancelled")
WAIT_POLL_S = 0.1


def _wait_ended(client, tasks: list, shown) -> list:
    """`tasks` once each has ended, in their order; `shown(task)` as each one ends."""
    pb = _pb()
    out = {t.id: t for t in tasks if t.state in ENDED}
    for t in out.values():
        if shown:
            shown(t)
    waiting = [t.id for t in tasks if t.id not in out]
    while waiting:
        time.sleep(WAIT_POLL_S)
        for task_id in list(waiting):
            task = _call(client.Get, pb.GetRequest(id=task_id)).task
            if task.state in ENDED:
                out[task_id] = task
                waiting.remove(task_id)
                if shown:
                    shown(task)
    return [out[t.id] for t in tasks]


def exit_status(task) -> int:
    """What `submit --wait` exits with for an ended task, as systemd-run --wait and srun do:
    0 when it succeeded, its exit code, 128+N when signal N ended it, else 1 (cancelled,
    or it never ran: its error says why)."""
    if task.state == "Succeeded":
        return 0
    if task.HasField("signal") and task.signal > 0:
        return 128 + task.signal
    if task.HasField("exit_code") and 0 < task.exit_code < 256:
        return task.exit_code
    return 1


def _outcome(t) -> str:
    if t.HasField("exit_code"):
        return f" (exit {t.exit_code})"
    if t.HasField("signal"):
        return f" (signal {t.signal})"
    return f" ({t.error})" if t.error else ""


@click.command()
@click.option("--all", "all_", is_flag=True, help="Ended tasks too.")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=1000,
    show_default=True,
    help="At most this many tasks, newest first.",
)
@click.option(
    "--page-token",
    default="",
    type=Text(MAX_ID, printable=True),
    help="The next page: the token the last page gave.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {tasks, next_page_token, total}.")
@socket_option
def ps(all_, limit, page_token, as_json, socket_path) -> None:
    """The agent's tasks, newest first: id, name, state, where, and why a Pending task
    waits. A page at a time: what follows is named on standard error."""
    pb = _pb()
    request = pb.ListRequest(all=all_, limit=limit, page_token=page_token)
    reply = _call(_client(socket_path).List, request)
    tasks = reply.tasks
    if as_json:
        page = {"tasks": [task_json(t) for t in tasks], "next_page_token": reply.next_page_token}
        click.echo(json.dumps(page | {"total": reply.total}, indent=2))
        return
    if reply.next_page_token or page_token:  # a page of them: say so, and what follows
        shown = f"{len(tasks)} older" if page_token else f"the newest {len(tasks)}"
        more = f"; --page-token {reply.next_page_token} for more" if reply.next_page_token else ""
        click.echo(f"showing {shown} of {reply.total} tasks{more}", err=True)
    # one write for the table: a page is a thousand rows, and click.echo flushes each call
    header = f"{'ID':<10} {'NAME':<24} {'STATE':<10} {'CPUS':<10} NOTE"
    click.echo("\n".join([header, *map(_row, tasks)]))


def _row(t) -> str:
    note = "; ".join(r.detail for r in t.reasons) or _outcome(t).strip(" ()")
    if t.unenforced and not note:
        note = "not enforced: " + ", ".join(u.limit.split("=")[0] for u in t.unenforced)
    cpus = ",".join(map(str, t.cpus)) or "-"
    return f"{t.id:<10} {t.name[:24]:<24} {t.state:<10} {cpus[:10]:<10} {note}"


@click.command()
@click.argument("task_id", type=TASK_ID)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@socket_option
def get(task_id, as_json, socket_path) -> None:
    """One task in full: state, placement, limits not enforced and why, outcome."""
    t = _call(_client(socket_path).Get, _pb().GetRequest(id=task_id)).task
    if as_json:
        click.echo(json.dumps(task_json(t), indent=2))
        return
    click.echo(f"{t.id} {t.name}: {t.state}{_outcome(t)} (attempt {t.attempt})")
    if t.node:
        click.echo(f"  node {t.node}, cpus {','.join(map(str, t.cpus))}")
    for r in t.reasons:
        click.echo(f"  waiting: {r.detail}")
    for u in t.unenforced:
        click.echo(f"  not enforced: {u.limit}: {u.reason}")
    if t.error:
        click.echo(f"  error: {t.error}")
    if t.HasField("cpu_usec") and t.ended_ns:
        wall = max(0, t.ended_ns - t.started_ns) / 1e9 if t.started_ns else None
        ran = f" in {wall:.3f} s" if wall is not None else ""
        click.echo(f"  cpu: {t.cpu_usec / 1e6:.3f} s used{ran}")
    if t.output_dropped_bytes:
        click.echo(
            f"  output: {t.output_dropped_bytes} bytes dropped (past the log cap, or after a "
            f"failed write: `xhagent events --task {t.id}` says which)"
        )


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON (numbers as numbers).")
@socket_option
def health(as_json, socket_path) -> None:
    """Whether the agent works: "ok", else what fails; its version, pid, socket, state and
    metrics. Exits 0 when it serves, 1 when something fails or no agent answers (for a
    liveness probe)."""
    h = _call(_client(socket_path).Health, _pb().HealthRequest())
    serving = h.status == "ok"
    if as_json:
        doc = {
            "status": h.status,
            "serving": serving,
            "version": h.version,
            "pid": h.pid,
            "uptime_s": round(h.uptime_s, 3),
            "socket": h.socket,
            "state_dir": h.state_dir,
            "metrics_url": h.metrics_addr,
            "pool": json.loads(h.pool_json) if h.pool_json else None,
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(f"{'serving' if serving else 'NOT SERVING'}: {h.status}")
        click.echo(f"  xhagent {h.version}, pid {h.pid}, up {h.uptime_s:.0f} s")
        click.echo(f"  socket {h.socket}, state {h.state_dir}")
        click.echo(f"  metrics {h.metrics_addr or 'off'}")
    if not serving:
        sys.exit(1)


@click.command()
@click.argument("task_id", type=TASK_ID)
@click.option("--json", "as_json", is_flag=True, help="Print the task after it as JSON.")
@socket_option
def cancel(task_id, as_json, socket_path) -> None:
    """Stop a task: kill its processes (cgroup.kill) and remove its leaf."""
    t = _call(_client(socket_path).Cancel, _pb().CancelRequest(id=task_id)).task
    if as_json:
        click.echo(json.dumps(task_json(t), indent=2))
    else:
        click.echo(f"{t.id} {t.name} {t.state}{_outcome(t)}")


@click.command()
@click.argument("task_id", type=TASK_ID)
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the task ends.")
@click.option(
    "--stream", type=click.Choice(["both", "stdout", "stderr"]), default="both", show_default=True
)
@click.option(
    "--tail",
    "tail_lines",
    type=click.IntRange(0, MAX_TAIL_LINES),
    default=None,
    metavar="N",
    help="Only the last N lines of each stream (then, with -f, what follows).",
)
@click.option(
    "--since",
    "since_ns",
    type=Since(),
    default=None,
    metavar="D",
    help="Only what was written since D: a duration back from now (30s, 5m, 1h30m) or an "
    "RFC 3339 time; to the second (output of D's own second may show). With --tail, the "
    "later start.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='One JSON object per chunk: {"stream", "offset", "text"} (UTF-8, bad bytes as U+FFFD).',
)
@socket_option
def logs(task_id, follow, stream, tail_lines, since_ns, as_json, socket_path) -> None:
    """A task's output (its current attempt's stdout and stderr)."""
    pb = _pb()
    which = {
        "both": pb.LOG_STREAM_BOTH,
        "stdout": pb.LOG_STREAM_STDOUT,
        "stderr": pb.LOG_STREAM_STDERR,
    }[stream]
    client = _client(socket_path)
    request = pb.LogsRequest(
        id=task_id, stream=which, follow=follow, tail_lines=tail_lines, since_ns=since_ns
    )
    chunks = _call(client.Logs, request)
    from .client import ApiError

    names = {pb.LOG_STREAM_STDOUT: "stdout", pb.LOG_STREAM_STDERR: "stderr"}
    decoders: dict[int, codecs.IncrementalDecoder] = {}
    ends: dict[int, int] = {}  # the byte offset past each stream's last chunk
    try:
        for chunk in chunks:
            if as_json:  # a character cut between two chunks is decoded whole, in the second
                decoder = decoders.setdefault(chunk.stream, UTF8(errors="replace"))
                ends[chunk.stream] = chunk.offset + len(chunk.data)
                doc = {
                    "stream": names.get(chunk.stream, "?"),
                    "offset": chunk.offset,
                    "text": decoder.decode(chunk.data),
                }
                click.echo(json.dumps(doc, ensure_ascii=False))
                continue
            out = sys.stderr if chunk.stream == pb.LOG_STREAM_STDERR else sys.stdout
            out.buffer.write(chunk.data)
            out.flush()
        for which, decoder in decoders.items():  # a cut character at the very end
            held = len(decoder.getstate()[0])
            if rest := decoder.decode(b"", final=True):
                at = ends[which] - held
                doc = {"stream": names.get(which, "?"), "offset": at, "text": rest}
                click.echo(json.dumps(doc, ensure_ascii=False))
    except ApiError as exc:
        fail(str(exc), exc.exit_code)


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events.")
@click.option(
    "--task",
    "task_id",
    default="",
    type=Text(MAX_ID, printable=True),
    help="Only this task's events.",
)
@click.option(
    "--since",
    type=click.IntRange(0, INT64_MAX),
    default=0,
    show_default=True,
    help="After this sequence number.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@socket_option
def events(follow, task_id, since, as_json, socket_path) -> None:
    """The agent's event stream: submissions, transitions, policy changes."""
    from .client import ApiError

    pb = _pb()
    client = _client(socket_path)
    request = pb.WatchRequest(since_seq=since, task_id=task_id, follow=follow)
    stream = _call(client.Watch, request)
    try:
        for ev in stream:
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            "seq": ev.seq,
                            "ts_ns": ev.ts_ns,
                            "task_id": ev.task_id,
                            "kind": ev.kind,
                            "message": ev.message,
                            "detail": json.loads(ev.detail_json or "{}"),
                        }
                    )
                )
            else:
                when = time.strftime("%H:%M:%S", time.localtime(ev.ts_ns / 1e9))
                click.echo(f"{ev.seq:>6} {when} {ev.task_id or '-':<9} {ev.kind}: {ev.message}")
    except ApiError as exc:
        fail(str(exc), exc.exit_code)


def task_trace(task_id: str, socket_path: str | None) -> str:
    """The file of the task's last finished trace (its TraceRecorded event), asked of the
    agent; exits 2 naming the task when it has none."""
    from .client import ApiError

    client = _client(socket_path)
    path = None
    try:
        request = _pb().WatchRequest(task_id=task_id, since_seq=0, follow=False)
        for ev in _call(client.Watch, request):
            if ev.kind == "TraceRecorded":
                path = json.loads(ev.detail_json or "{}").get("path") or path
    except ApiError as exc:
        fail(str(exc), exc.exit_code)
    if path is None:
        fail(f"task {task_id} has no finished trace (trace: true, once an attempt ended)", 2)
    return path


@click.command()
@click.option(
    "-f",
    "--file",
    "path",
    required=True,
    type=InputFile(),
    help="A SchedulingPolicy or CgroupPolicy file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {policies, cgroup_changes}.")
@socket_option
def apply(path, as_json, socket_path) -> None:
    """Apply policies through the agent (kept until `xhagent delete policy NAME`).

    A CgroupPolicy goes into the node's cgroup tree whole or not at all: one the node cannot
    enforce is refused (exit 1), each setting named with why."""
    from ...spec import SpecError, read_text

    try:
        source = read_text(path)
    except SpecError as exc:
        fail(str(exc), 2)
    reply = _call(
        _client(socket_path).ApplyPolicy,
        _pb().ApplyPolicyRequest(source=source, file_name=shown_path(path)),
    )
    if as_json:
        click.echo(json.dumps(task_json(reply), indent=2))
        return
    for p in reply.policies:
        click.echo(f"applied {p.kind} {p.name} (version {p.version})")
    for change in reply.cgroup_changes:
        click.echo(f"  {change}")


@click.group()
def delete() -> None:
    """Remove something the agent keeps."""


@delete.command("policy")
@click.argument("name", type=Text(MAX_NAME, printable=True, required=True))
@click.option("--kind", type=click.Choice(["SchedulingPolicy", "CgroupPolicy"]), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print {removed} as JSON.")
@socket_option
def delete_policy(name, kind, as_json, socket_path) -> None:
    """Remove a policy applied through the API."""
    reply = _call(
        _client(socket_path).RemovePolicy, _pb().RemovePolicyRequest(kind=kind or "", name=name)
    )
    if as_json:
        click.echo(json.dumps(task_json(reply), indent=2))
    else:
        click.echo(f"removed {reply.removed.kind} {reply.removed.name}")


@click.command()
@click.argument("task_id", type=TASK_ID)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@socket_option
def explain(task_id, as_json, socket_path) -> None:
    """Where a task goes or why it waits: every node's verdict."""
    reply = _call(_client(socket_path).Explain, _pb().ExplainRequest(id=task_id))
    if as_json:
        click.echo(reply.detail_json)
        return
    click.echo(
        f"{task_id}: {'Pending' if reply.pending else 'placed'}"
        + (f" (policy {reply.policy})" if reply.policy else "")
    )
    for v in reply.verdicts:
        click.echo(f"  {v.node}: " + (f"fits (score {v.score:.3f})" if v.fits else v.reason))
