"""What it takes to run a `kind: Task`: its command and environment, whom it runs as, its
class, restarts, preemption and the limits it demands be enforced.

    command: [sh, -c, 'echo hello; sleep 2']   # argv; required to run, optional to explain
    env: {GREETING: hello, DEBUG: "1"}         # strings only: quote numbers and booleans
    workingDir: /tmp                           # absolute; checked when the task starts
    user: nobody:nogroup                       # name or uid, optionally :group or :gid
    class: batch                               # default batch; meaning: the CgroupPolicy's
    restartPolicy: {policy: OnFailure, maxRestarts: 3, backoff: 2s}   # or just OnFailure
    preemption: freeze                         # freeze (default) | kill | never
    enforce: [cpu, memory]                     # these limits or no start (stays Pending)
    checkpoint: {command: [ckpt, --save], timeout: 30s}   # migratable tasks: run on a move
    trace: true                                # record its scheduler events (default false)
    traceStacks: kernel                        # and each switch-out's stacks (none)

Every field is checked for syntax only. A name in `user` is resolved against the node's user
database when the task starts, not when the file is read: the file describes the task, not
the node it happens to be validated on, so an unknown user fails the start, not the file.
The same holds for `workingDir` (it must exist at start) and for `class` (the CgroupPolicy
gives a class its cpu.weight and io.weight; a class it does not know is the start's error).
Without `user` a task runs as the agent's own user. `command` is exec'd as it is, through no
shell unless it names one.

Bounds, so that what parses can be handed to execve: `command` has at least one argument,
none empty, each at most 4096 bytes and all together at most 128 KiB (each with its NUL);
`env` at most 1024 variables named `[A-Za-z_][A-Za-z0-9_]*`; no NUL anywhere; `workingDir`
absolute and at most 4096 bytes; user and group names at most 32 characters, ids at most
2**32 - 2; `class` a DNS-1123 label (at most 63).

`restartPolicy`: `Never` (default) runs the command once. `OnFailure` starts it again after a
non-zero exit or a death by signal, at most `maxRestarts` times (0..1000, default 3); the
n-th restart (n = 0, 1, ...) waits `backoff * 2**n`, at most 5m (`RestartPolicy.delay_ns`);
`backoff` is 1ns..5m, default 1s. A task preempted with `kill` has not failed: it is
requeued, and that is not counted as a restart.

`preemption` says how a higher-priority task may take this one's place: `freeze` (default,
for every class) stops it with `cgroup.freeze` and thaws it later, keeping its memory;
`kill` ends it with `cgroup.kill` and requeues it, for work that restarts cheaply or whose
memory is what the preemptor needs; `never` keeps it running, and the core looks for
another victim or leaves the preemptor Pending.

`enforce` lists controllers (`cpu`, `cpuset`, `memory`, `io`, `pids`) whose limits must be
enforced on the node: where one cannot be, the task stays Pending with a typed reason
instead of running with that limit ignored. Without `enforce`, a task runs where a limit
cannot be enforced, and `get`/`ps` say which limit was not and why.

`checkpoint` (only with `migratable: true`) is what the daemon runs when it moves the task to
another device (xhagent.daemon.loop.migration): after the workload is stopped and before it is
started again on the new device. `command` is an argv like `command` (no shell unless it
names one), run as the task's user, in its working directory, with its `env` plus
XHAGENT_TASK_ID, XHAGENT_MIGRATE_FROM and XHAGENT_MIGRATE_TO and the old device's
CUDA_VISIBLE_DEVICES / TPU_VISIBLE_CHIPS; `timeout` is 1ms..5m, default 30s (the agent waits
for it). A non-zero exit or a timeout cancels the move: the task starts again where it was.

`trace: true` has the agent record the task's scheduler events (sched_switch, wakeups,
forks and exits of the processes in its leaf, by eBPF) for each attempt, into
`<state>/tasks/<id>/<attempt>/sched.xht`, the format of `xhagent trace record`
(xhagent.daemon.exec.tracing). `traceStacks: kernel|user|both` (only with `trace: true`)
adds those stacks of each switch-out, as `trace record --stacks` does: `xhagent trace offcpu`
of the attempt's trace then says where it waited.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..spec import Cursor, SpecError, SpecErrors
from .policy import parse_name
from .units import format_duration, parse_duration_ns

if TYPE_CHECKING:
    from .task import Task

EXEC_FIELDS = (
    "command",
    "env",
    "workingDir",
    "user",
    "class",
    "restartPolicy",
    "preemption",
    "enforce",
    "checkpoint",
    "trace",
    "traceStacks",
)
TRACE_STACKS = ("none", "kernel", "user", "both")
MAX_ARG_BYTES = 4096
MAX_ARGV_BYTES = 128 << 10  # counted with each argument's terminating NUL, as execve does
# The kernel's own bound on one argv or environment string (MAX_ARG_STRLEN).
MAX_ENV_STRING_BYTES = 128 << 10
MAX_ENV = 1024
MAX_PATH_BYTES = 4096  # PATH_MAX
MAX_USER_NAME = 32  # what useradd accepts on Linux
MAX_ID = 2**32 - 2  # (uid_t)-1 means "no change" to setresuid: never a real id
MAX_CLASS_NAME = 63  # a DNS-1123 label: a class may name a cgroup

DEFAULT_CLASS = "batch"
RESTART_POLICIES = ("Never", "OnFailure")
DEFAULT_MAX_RESTARTS = 3
MAX_RESTARTS = 1000
DEFAULT_BACKOFF_NS = 10**9
BACKOFF_CAP_NS = 5 * 60 * 10**9
PREEMPTION_MODES = ("freeze", "kill", "never")
DEFAULT_PREEMPTION = "freeze"
ENFORCEABLE = ("cpu", "cpuset", "memory", "io", "pids")
DEFAULT_CHECKPOINT_TIMEOUT_NS = 30 * 10**9
CHECKPOINT_TIMEOUT_CAP_NS = 5 * 60 * 10**9

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# POSIX portable user and group names, less a leading digit: an all-digit name is an id.
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9._-]*")
_ID = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class RunAs:
    """`user`: a name or a uid, and optionally a group name or gid; resolved at start."""

    user: str | int
    group: str | int | None = None

    def dump(self) -> str:
        return f"{self.user}" if self.group is None else f"{self.user}:{self.group}"


@dataclass(frozen=True)
class RestartPolicy:
    policy: str = "Never"
    max_restarts: int = DEFAULT_MAX_RESTARTS
    backoff_ns: int = DEFAULT_BACKOFF_NS

    def delay_ns(self, restarts: int) -> int:
        """How long to wait before restart number `restarts` (0 for the first)."""
        # A bounded shift: even a 1ns backoff passes the 5m cap within 40 doublings.
        return min(self.backoff_ns << min(restarts, 40), BACKOFF_CAP_NS)

    def dump(self) -> str | dict[str, Any]:
        if (self.max_restarts, self.backoff_ns) == (DEFAULT_MAX_RESTARTS, DEFAULT_BACKOFF_NS):
            return self.policy
        return {
            "policy": self.policy,
            "maxRestarts": self.max_restarts,
            "backoff": format_duration(self.backoff_ns),
        }


@dataclass(frozen=True)
class Checkpoint:
    """`checkpoint`: the argv run between a migration's stop and its restart."""

    command: tuple[str, ...]
    timeout_ns: int = DEFAULT_CHECKPOINT_TIMEOUT_NS

    def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {"command": list(self.command)}
        if self.timeout_ns != DEFAULT_CHECKPOINT_TIMEOUT_NS:
            out["timeout"] = format_duration(self.timeout_ns)
        return out


# ------------------------------------------------------------------------- parsing


def parse_exec(spec: Cursor) -> dict[str, Any]:
    """The Task fields of EXEC_FIELDS, by their dataclass names; errors kept in the document."""
    doc = spec.doc
    return dict(
        command=doc.attempt(lambda: parse_command(spec["command"])),
        env=doc.attempt(lambda: parse_env(spec["env"]), ()),
        working_dir=doc.attempt(lambda: parse_working_dir(spec["workingDir"])),
        user=doc.attempt(lambda: spec["user"].parse(parse_user, "user", None, as_written=True)),
        task_class=doc.attempt(lambda: parse_class(spec["class"]), DEFAULT_CLASS),
        restart_policy=doc.attempt(
            lambda: parse_restart_policy(spec["restartPolicy"]), RestartPolicy()
        ),
        preemption=doc.attempt(
            lambda: spec["preemption"].str(PREEMPTION_MODES, default=DEFAULT_PREEMPTION),
            DEFAULT_PREEMPTION,
        ),
        enforce=doc.attempt(lambda: parse_enforce(spec["enforce"]), ()),
        checkpoint=doc.attempt(lambda: parse_checkpoint(spec["checkpoint"])),
        trace=doc.attempt(lambda: spec["trace"].bool(default=False), False),
        trace_stacks=doc.attempt(lambda: parse_trace_stacks(spec), "none"),
    )


def parse_trace_stacks(spec: Cursor) -> str:
    cur = spec["traceStacks"]
    kind = cur.str(TRACE_STACKS, default="none")
    if kind != "none" and not spec["trace"].bool(default=False):
        raise cur.error(f"{cur.where}: takes stacks of a trace: set trace: true as well")
    return kind


def parse_command(cur: Cursor) -> tuple[str, ...] | None:
    if not cur.present:
        return None
    if isinstance(cur.value, str):
        raise cur.error(
            f"{cur.where}: expected a list of arguments such as [sh, -c, 'echo hi'], got a string"
        )
    args = cur.seq()
    if not args:
        raise cur.error(f"{cur.where}: an empty list: the first argument names the program")
    total, errors = 0, []
    for arg in args:
        try:
            value = _c_string(arg, MAX_ARG_BYTES, "an argument", allow_empty=False)
            total += len(value.encode("utf-8", "surrogatepass")) + 1
        except SpecError as exc:
            errors.append(exc)
    if errors:
        raise SpecErrors(errors)
    if total > MAX_ARGV_BYTES:
        raise cur.error(
            f"{cur.where}: the arguments take {total:,} bytes, more than {MAX_ARGV_BYTES:,} "
            "(128 KiB, each counted with a terminating NUL)"
        )
    return tuple(a.value for a in args)


def parse_env(cur: Cursor) -> tuple[tuple[str, str], ...]:
    if not cur.present:
        return ()
    cur.mapping()
    if len(cur.value) > MAX_ENV:
        raise cur.error(f"{cur.where}: {len(cur.value):,} variables, more than {MAX_ENV:,}")
    env, errors = [], []
    for name, value in cur.items():
        try:
            if not (isinstance(name, str) and _ENV_NAME.fullmatch(name)):
                raise key_error(
                    cur,
                    name,
                    f"{cur.where}: {str(name)[:60]!r} is not a variable name "
                    "(letters, digits and '_', not starting with a digit)",
                )
            # NAME=value is one string of the new process's environment.
            text = _c_string(value, MAX_ENV_STRING_BYTES - len(name) - 2, "a value")
            env.append((name, text))
        except SpecError as exc:
            errors.append(exc)
    if errors:
        raise SpecErrors(errors)
    return tuple(env)


def parse_working_dir(cur: Cursor) -> str | None:
    if not cur.present:
        return None
    path = _c_string(cur, MAX_PATH_BYTES, "a path")
    if not path.startswith("/"):
        raise cur.error(f"{cur.where}: {_shown(path)} is not an absolute path (start it with /)")
    return path


def parse_user(value: Any) -> RunAs:
    """`name`, `uid`, `name:group`, `uid:gid` (any mix) -> RunAs; syntax only."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str):
        raise ValueError("expected a user name or uid, optionally with :group or :gid")
    user, sep, group = text.partition(":")
    if sep and not group:
        raise ValueError("nothing after ':' (write name:group, or leave out the ':')")
    return RunAs(_user_or_id(user, "user"), _user_or_id(group, "group") if sep else None)


def _user_or_id(text: str, what: str) -> str | int:
    if _ID.fullmatch(text):
        if int(text) > MAX_ID:
            raise ValueError(f"{what} id {text} is out of range 0..{MAX_ID}")
        return int(text)
    if len(text) > MAX_USER_NAME or not _USER_NAME.fullmatch(text):
        raise ValueError(
            f"{what} {_shown(text)} is not a name (letters, digits, '.', '_' and '-', "
            f"starting with a letter or '_', at most {MAX_USER_NAME}) or a numeric id"
        )
    return text


def parse_class(cur: Cursor) -> str:
    if not cur.present:
        return DEFAULT_CLASS
    name = cur.str()
    try:
        parse_name(cur)  # metadata.name's characters; a label then drops '.' and 190 of its 253
        valid = "." not in name and len(name) <= MAX_CLASS_NAME
    except SpecError:
        valid = False
    if not valid:
        raise cur.error(
            f"{cur.where}: {_shown(name)} is not a class name (a DNS-1123 label: lowercase "
            f"letters, digits and '-', starting and ending with a letter or digit, "
            f"at most {MAX_CLASS_NAME})"
        )
    return name


def parse_restart_policy(cur: Cursor) -> RestartPolicy:
    if not cur.present:
        return RestartPolicy()
    if isinstance(cur.value, str):
        return RestartPolicy(cur.str(RESTART_POLICIES))
    if not isinstance(cur.value, dict):
        raise cur.error(
            f"{cur.where}: expected Never, OnFailure or a mapping such as "
            "{policy: OnFailure, maxRestarts: 3, backoff: 1s}"
        )
    # fields(), not mapping(): a misspelt key and a bad value are reported together.
    cur.fields({"policy", "maxRestarts", "backoff"}, required={"policy"})
    doc, policy = cur.doc, cur["policy"].str(RESTART_POLICIES)
    if policy == "Never":
        errors = [
            key_error(cur, key, f"{cur.where}.{key}: only with policy OnFailure")
            for key in ("maxRestarts", "backoff")
            if cur[key].present
        ]
        if errors:
            raise SpecErrors(errors)
    return RestartPolicy(
        policy,
        doc.attempt(
            lambda: cur["maxRestarts"].int(0, MAX_RESTARTS, default=DEFAULT_MAX_RESTARTS),
            DEFAULT_MAX_RESTARTS,
        ),
        doc.attempt(lambda: _backoff(cur["backoff"]), DEFAULT_BACKOFF_NS),
    )


def _backoff(cur: Cursor) -> int:
    ns = cur.parse(parse_duration_ns, "duration", DEFAULT_BACKOFF_NS)
    if not 0 < ns <= BACKOFF_CAP_NS:
        raise cur.error(
            f"{cur.where}: {cur.text} is out of range 1ns..5m (it doubles after each restart, "
            "up to 5m)"
        )
    return ns


def distinct_choices(cur: Cursor, choices) -> tuple[str, ...]:
    """A list of names out of `choices`, each at most once; every bad item reported."""
    names, errors = [], []
    for item in cur.seq():
        try:
            name = item.str(choices)
            if name in names:
                raise item.error(f"{item.where}: {name!r} is listed twice")
            names.append(name)
        except SpecError as exc:
            errors.append(exc)
    if errors:
        raise SpecErrors(errors)
    return tuple(names)


def parse_enforce(cur: Cursor) -> tuple[str, ...]:
    return distinct_choices(cur, ENFORCEABLE) if cur.present else ()


def parse_checkpoint(cur: Cursor) -> Checkpoint | None:
    if not cur.present:
        return None
    if not isinstance(cur.value, dict):
        raise cur.error(
            f"{cur.where}: expected a mapping such as {{command: [ckpt, --save], timeout: 30s}}"
        )
    cur.fields({"command", "timeout"}, required={"command"})
    doc = cur.doc
    command = doc.attempt(lambda: parse_command(cur["command"]))
    timeout = doc.attempt(
        lambda: _checkpoint_timeout(cur["timeout"]), DEFAULT_CHECKPOINT_TIMEOUT_NS
    )
    if command is None:
        return None  # its error is in the document
    return Checkpoint(command, timeout)


def _checkpoint_timeout(cur: Cursor) -> int:
    ns = cur.parse(parse_duration_ns, "duration", DEFAULT_CHECKPOINT_TIMEOUT_NS)
    if not 10**6 <= ns <= CHECKPOINT_TIMEOUT_CAP_NS:
        raise cur.error(f"{cur.where}: {cur.text} is out of range 1ms..5m")
    return ns


def require_command(spec: Cursor) -> None:
    """Refuse a Task that cannot run: `spec` (the document's `spec`) has no `command`.
    Placement reads no command, so only the daemon asks for it (`parse_task(...,
    require_command=True)`); the error is located at `spec:`."""
    if spec.present and not spec["command"].present:
        raise spec.error(
            "missing required field 'spec.command' (the argv to run, such as [sh, -c, 'echo hi'])"
        )


def dump_exec(t: Task) -> dict[str, Any]:
    """The execution fields of `t` in file form; a field at its default is left out."""
    fields = (
        ("command", list(t.command) if t.command is not None else None),
        ("env", dict(t.env) if t.env else None),
        ("workingDir", t.working_dir),
        ("user", t.user.dump() if t.user is not None else None),
        ("class", t.task_class if t.task_class != DEFAULT_CLASS else None),
        (
            "restartPolicy",
            t.restart_policy.dump() if t.restart_policy != RestartPolicy() else None,
        ),
        ("preemption", t.preemption if t.preemption != DEFAULT_PREEMPTION else None),
        ("enforce", list(t.enforce) if t.enforce else None),
        ("checkpoint", t.checkpoint.dump() if t.checkpoint is not None else None),
        ("trace", True if t.trace else None),
        ("traceStacks", t.trace_stacks if t.trace_stacks != "none" else None),
    )
    return {k: v for k, v in fields if v is not None}


# ------------------------------------------------------------------------- helpers


def _c_string(cur: Cursor, limit: int, what: str, allow_empty: bool = True) -> str:
    """A string that can be handed to execve: no NUL, at most `limit` bytes of UTF-8."""
    value = cur.value
    if value is None:
        hint = ' (write "" for an empty one)' if allow_empty else ""
        raise cur.error(f"{cur.where}: expected a string, got null{hint}")
    if not isinstance(value, str):
        try:
            cur.str()
        except SpecError as exc:
            if isinstance(value, list | dict) or not cur.text:
                raise
            # YAML reads `true` as a boolean and `010` as 8: quoting keeps what was written.
            raise cur.error(f'{exc.message} (quote it: "{cur.text}")') from None
    if "\0" in value:
        raise cur.error(f"{cur.where}: {what} cannot contain a NUL character")
    if not value and not allow_empty:
        raise cur.error(f"{cur.where}: {what} cannot be empty")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise cur.error(f"{cur.where}: {what} of {size:,} bytes, more than {limit:,}")
    return value


def key_error(cur: Cursor, key: Any, message: str) -> SpecError:
    """An error about a key of the mapping at `cur`, located at the key itself."""
    pos = cur.doc.positions.get((*cur.path, key, "<key>")) or cur.doc.position((*cur.path, key))
    return SpecError(cur.doc.file, *pos, message)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")
