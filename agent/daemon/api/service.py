"""The `xhagent.v1.Agent` service: each RPC turned into a call on the scheduler loop or the
policy set, and back.

Served by grpc's asyncio server (transport.Server): the unary methods are plain functions
run on the servicer's executor (`transport.unary`); Watch and Logs are asyncio generators.

Status codes (transport.Failure): INVALID_ARGUMENT for input with FILE:LINE:COL errors or a
field out of range (request_checks, before any method), NOT_FOUND for an unknown task or
policy, FAILED_PRECONDITION for a refusal (a task that already ended, the store full, a
policy held by a file), PERMISSION_DENIED for what the caller may not do (access.py: each
refusal is also an event naming the caller), DATA_LOSS for a task whose stored row cannot
be read, INTERNAL (counted as an `api` internal error) for anything else a method raised.

Every call is made by a caller the kernel vouches for (peers.py); a task another caller
owns is NOT_FOUND to a caller who may not see it, as if it did not exist.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from ... import __version__, heap
from ..loop.faults import Faults
from ..loop.ranking import Standing
from ..loop.scheduler import MAX_LIST_PAGE, RequestRefused, Scheduler
from ..loop.submission import InvalidTask
from ..policies.policy_set import PolicySet
from ..policies.sources import PolicyError
from ..store import CorruptTask, Owner, StoreError, TaskRecord, parse_task_id
from . import access as rules
from . import request_checks
from .access import Access, Directory
from .feed import ChangeFeed
from .output_files import OutputRefused, read_output, since_offset, tail_offset
from .peers import Caller
from .standard import AgentHealth
from .transport import (
    DataLoss,
    FailedPrecondition,
    Failure,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    internal_error,
    unary,
)
from .v1 import agent_pb2 as pb
from .v1 import agent_pb2_grpc

log = logging.getLogger("xhagent")
FOLLOW_WAKE_S = 30.0  # a following stream looks again this often with nothing new
LOG_CHUNK = 64 * 1024
UNREADABLE = "Unreadable"  # the state List shows for a task whose stored row cannot be read
API_THREADS = 32  # for the blocking part of calls; a waiting stream holds none
MAX_STREAMS_PER_CALLER = 1024  # following Watch and Logs streams open at once, per uid
TRIM_AFTER_STREAMS_S = 5.0  # quiet after the last stream closed: its memory goes back
REFUSAL_EVENTS_PER_MINUTE = 20  # per uid: the rest are counted in the log, not the store


def _give_back() -> None:
    """Cycles first (a cancelled call's generator, its frame and its context refer to one
    another), then the heap pages they held."""
    gc.collect()
    heap.trim()


def task_message(rec: TaskRecord, standing: Standing) -> pb.Task:
    """A task as the API shows it: its record, and its standing as scheduling uses it now."""
    placed = rec.placement
    msg = pb.Task(
        id=rec.id,
        name=rec.name,
        state=rec.state.value,
        reasons=[pb.Reason(kind=r.kind, node=r.node, detail=r.detail) for r in rec.reasons],
        node=placed.node if placed else "",
        cpus=placed.cpus if placed else (),
        gpus=placed.gpu_uuids if placed else (),
        error=rec.error or "",
        created_ns=rec.created_ns,
        started_ns=rec.started_ns or 0,
        ended_ns=rec.ended_ns or 0,
        attempt=rec.attempt,
        unenforced=[
            pb.Unenforced(limit=u.setting, reason=u.reason)
            for u in (placed.unenforced if placed else ())
        ],
        task_class=rec.summary.task_class,
        priority=standing.priority,
        device_type=rec.summary.device_type,
        policy=standing.policy,
        output_dropped_bytes=rec.output_dropped,
    )
    msg.labels.update(rec.summary.labels)
    if rec.owner is not None:
        msg.owner_uid = rec.owner.uid
    if rec.exit_code is not None:
        msg.exit_code = rec.exit_code
    if rec.signal is not None:
        msg.signal = rec.signal
    if rec.cpu_usec is not None:
        msg.cpu_usec = rec.cpu_usec
    return msg


def authorized(impl):
    """`impl(self, request, access)` from `impl(self, request, peer)`: the caller known, and
    each PermissionDenied it raises recorded as an event naming the caller."""

    def method(self, request, peer):
        who = self.authorize(peer)
        try:
            return impl(self, request, who)
        except rules.PermissionDenied as exc:
            self.refused(who.caller, impl.__name__, str(exc))
            raise PermissionDenied(str(exc)) from None

    method.__name__ = impl.__name__
    method.__doc__ = impl.__doc__
    return method


class AgentService(agent_pb2_grpc.AgentServicer):
    def __init__(
        self,
        scheduler: Scheduler,
        policies: PolicySet,
        info: dict,
        faults: Faults,
        directory: Directory | None = None,
        max_streams: int = MAX_STREAMS_PER_CALLER,
    ):
        self.scheduler = scheduler
        self.faults = faults
        self.policies = policies
        self.info = info  # socket, state_dir, metrics_addr for Health
        self.directory = directory or Directory()
        self.max_streams = max_streams
        self.started = time.monotonic()
        self.executor = ThreadPoolExecutor(API_THREADS, thread_name_prefix="xhagent-api")
        # the caller of a connection, by grpc's peer string: given by transport.bind
        self.identify: Callable[[str], Caller | None] = lambda peer: None
        self._streams: Counter[int] = Counter()  # open streams per uid (the loop's thread)
        self._feed: ChangeFeed | None = None  # made on the server's loop by the first stream
        self._last_closed = 0.0  # loop time the last open stream closed
        self._refusals: dict[int, tuple[int, int]] = {}  # uid -> (minute, events in it)
        self._ending = False  # the agent stops: following streams end once they are current
        # grpc.health.v1 follows what Health's status says (standard.py)
        self.health = AgentHealth(self.trouble)
        scheduler.on_change(self._changed)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    # -- who is calling -----------------------------------------------------------------------
    def authorize(self, peer: str) -> Access:
        caller = self.identify(peer)
        if caller is None:
            raise Unauthenticated("this connection did not come through the agent's socket")
        return self.directory.access(caller)

    def refused(self, caller: Caller, rpc: str, why: str) -> None:
        """An event naming the caller, at most REFUSAL_EVENTS_PER_MINUTE a uid (a caller
        cannot fill the store with its own refusals); every refusal is logged."""
        log.warning("api: %s refused: %s", rpc, why)
        minute = int(time.monotonic() // 60)
        at, count = self._refusals.get(caller.uid, (minute, 0))
        count = count + 1 if at == minute else 1
        self._refusals[caller.uid] = (minute, count)
        if count > REFUSAL_EVENTS_PER_MINUTE:
            return
        detail = {"uid": caller.uid, "gid": caller.gid, "pid": caller.pid, "rpc": rpc}
        try:
            self.scheduler.store.add_event("PermissionDenied", f"{rpc}: {why}", detail=detail)
        except StoreError as exc:
            log.warning("api: the refusal was not recorded: %s", exc)

    def check(self, request) -> None:
        """Run by the transport before every method: each field in its range."""
        request_checks.check(request)

    def failure_of(self, method: str, exc: Exception) -> Failure:
        """What the transport answers for an exception no method turned into a status."""
        if isinstance(exc, CorruptTask):
            return DataLoss(str(exc))
        self.faults.counted("api", exc, method)
        return internal_error(method, exc)

    def _messages(self, recs: list[TaskRecord | CorruptTask]) -> list[pb.Task]:
        """Tasks as the API shows them; a row that cannot be read as its id and what is
        wrong with it (state `Unreadable`), so that one bad row hides no other task."""
        readable = [r for r in recs if isinstance(r, TaskRecord)]
        standings = iter(self.scheduler.standings(readable))
        return [
            task_message(r, next(standings))
            if isinstance(r, TaskRecord)
            else pb.Task(id=r.task_id, state=UNREADABLE, error=str(r))
            for r in recs
        ]

    def _task(self, task_id: str, who: Access) -> TaskRecord:
        """The task, when `who` may see it; another's is as unknown as a missing one, also
        when its row is unreadable (DataLoss is for the owner and admins)."""
        try:
            rec = self.scheduler.get(task_id)
        except CorruptTask as corrupt:
            if who.owns(corrupt.owner_uid):
                raise
            raise NotFound(f"no task {task_id}") from None
        if rec is None or not who.owns(rec.owner.uid if rec.owner else None):
            raise NotFound(f"no task {task_id}")
        return rec

    @unary
    @authorized
    def Submit(self, request, who: Access):
        def owner_of(task) -> Owner:
            user = task.user
            run = who.run_as(user.user if user else None, user.group if user else None, task.name)
            return Owner(who.uid, *(run or (None, None)))

        try:
            recs = self.scheduler.submit(
                request.source,
                request.file_name or "<submitted>",
                request.idempotency_key,
                owner_of,
            )
        except InvalidTask as exc:
            raise InvalidArgument(str(exc)) from None
        except StoreError as exc:
            raise FailedPrecondition(str(exc)) from None
        return pb.SubmitResponse(tasks=self._messages(recs))

    @unary
    @authorized
    def Get(self, request, who: Access):
        return pb.GetResponse(task=self._messages([self._task(request.id, who)])[0])

    @unary
    @authorized
    def List(self, request, who: Access):
        token = request.page_token
        try:
            if token:
                parse_task_id(token)
        except ValueError:
            raise InvalidArgument(
                f"page_token: {token[:40]!r} is not a token a List reply gave"
            ) from None
        try:
            recs, next_token, total = self.scheduler.list(
                list(request.states),
                request.all,
                request.limit or MAX_LIST_PAGE,
                token,
                None if who.admin else who.uid,
            )
        except ValueError as exc:  # a state that does not exist
            raise InvalidArgument(f"states: {exc}") from None
        return pb.ListResponse(tasks=self._messages(recs), next_page_token=next_token, total=total)

    @unary
    @authorized
    def Cancel(self, request, who: Access):
        self._task(request.id, who)
        try:
            rec = self.scheduler.cancel(request.id)
        except KeyError:
            raise NotFound(f"no task {request.id}") from None
        except RequestRefused as exc:
            raise FailedPrecondition(str(exc)) from None
        return pb.CancelResponse(task=self._messages([rec])[0])

    # -- streams --------------------------------------------------------------------------------
    # Asyncio generators: grpc cancels one whose client has gone at its next await. Between
    # reads a following stream waits on the change feed, on the loop: no thread waits for
    # it, so idle streams cost memory, not threads. What blocks (the store, files) runs on
    # the executor, briefly.
    def trouble(self) -> str | None:
        """None while nothing fails; else one line per thing that does (Health's status)."""
        return self.faults.health() or self.scheduler.disk.health()

    def _changed(self) -> None:
        self.health.changed()
        if self._feed is not None:
            self._feed.bump()

    async def _open_stream(self, context, rpc: str) -> Access:
        who = await self._blocking(self.authorize, context.peer())
        uid = who.uid
        if self._streams[uid] >= self.max_streams:
            why = f"{who.caller} holds {self._streams[uid]} streams, the most a caller may"
            await self._blocking(self.refused, who.caller, rpc, why)
            raise ResourceExhausted(why)
        self._streams[uid] += 1
        if self._feed is None:
            self._feed = ChangeFeed(asyncio.get_running_loop())
        return who

    async def end_streams(self, timeout: float) -> None:
        """At a stop, before the connections are cut (on the server's loop): following Watch
        streams send what is left, the Stopping event among it, and end, so that a follower
        sees a clean end rather than a broken connection. At most `timeout` seconds."""
        self._ending = True
        if self._feed is None:
            return
        self._feed.bump()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._streams and loop.time() < deadline:
            await asyncio.sleep(0.02)

    def _close_stream(self, who: Access) -> None:
        self._streams[who.uid] -= 1
        if self._streams[who.uid] <= 0:
            del self._streams[who.uid]
        if not self._streams:  # the last one: once none opened for a while, trim the heap
            loop = asyncio.get_running_loop()
            self._last_closed = closed = loop.time()
            loop.call_later(TRIM_AFTER_STREAMS_S, self._trim_if_quiet, closed)

    def _trim_if_quiet(self, closed: float) -> None:
        # Streams' buffers are freed into the heap, which keeps them (heap.keep_freed) for
        # the next burst; thousands of streams are no burst to keep for.
        if not self._streams and self._last_closed == closed:
            asyncio.get_running_loop().run_in_executor(self.executor, _give_back)

    async def Watch(self, request, context) -> AsyncIterator[pb.Event]:
        who = await self._open_stream(context, "Watch")
        try:
            if request.task_id:
                await self._blocking(self._task, request.task_id, who)
            owner = None if who.admin else who.uid
            since = request.since_seq if request.HasField("since_seq") else None
            if since is None:
                since = await self._blocking(self.scheduler.last_seq)
            while True:
                change = self._feed.current()  # before the read: a change after it wakes us
                events = await self._blocking(
                    self.scheduler.wait_events, since, request.task_id or None, 0.0, owner
                )
                if not events and (not request.follow or self._ending):
                    return
                for ev in events:
                    since = ev.seq
                    yield pb.Event(
                        seq=ev.seq,
                        ts_ns=ev.ts_ns,
                        task_id=ev.task_id or "",
                        kind=ev.kind,
                        message=ev.message,
                        detail_json=json.dumps(ev.detail or {}),
                    )
                if not events:
                    await self._feed.wait(change, FOLLOW_WAKE_S)
        finally:
            self._close_stream(who)

    async def Logs(self, request, context) -> AsyncIterator[pb.LogChunk]:
        who = await self._open_stream(context, "Logs")
        try:
            rec = await self._blocking(self._task, request.id, who)
            streams = {
                pb.LOG_STREAM_STDOUT: ["stdout"],
                pb.LOG_STREAM_STDERR: ["stderr"],
            }.get(request.stream, ["stdout", "stderr"])
            run_dir = self.scheduler.executor.run_dir(request.id, max(rec.attempt, 1))
            offsets = {name: request.offset for name in streams}
            starts = []  # where tail_lines and since_ns start each stream: the later wins
            if request.HasField("tail_lines"):
                starts.append((tail_offset, request.tail_lines, "tail_lines"))
            if request.HasField("since_ns"):
                starts.append((since_offset, request.since_ns, "since_ns"))
            for find, arg, field in starts:
                if request.offset:
                    raise InvalidArgument(f"{field}: not with an offset (offset must be 0)")
                for name in streams:
                    try:
                        at = await self._blocking(find, run_dir, name, arg)
                    except OutputRefused as exc:
                        raise FailedPrecondition(str(exc)) from None
                    offsets[name] = max(offsets[name], at)
            kind = {"stdout": pb.LOG_STREAM_STDOUT, "stderr": pb.LOG_STREAM_STDERR}
            while True:
                change = self._feed.current()
                sent = False
                for name in streams:
                    try:  # only the file the shim wrote (output_files.py says why)
                        data = await self._blocking(
                            read_output, run_dir, name, offsets[name], LOG_CHUNK
                        )
                    except OutputRefused as exc:
                        raise FailedPrecondition(str(exc)) from None
                    if data:
                        yield pb.LogChunk(stream=kind[name], data=data, offset=offsets[name])
                        offsets[name] += len(data)
                        sent = True
                if sent:
                    continue
                if not request.follow or await self._blocking(self.scheduler.ended, request.id):
                    return
                # output is not a change the feed hears of: look again at least twice a second
                await self._feed.wait(change, 0.5)
        finally:
            self._close_stream(who)

    async def _blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    @unary
    @authorized
    def ApplyPolicy(self, request, who: Access):
        who.require_admin("apply policies")
        try:
            infos, enacted = self.policies.apply(request.source, request.file_name or "<applied>")
        except PolicyError as exc:  # a CgroupPolicy the node cannot enforce: each setting, why
            raise (InvalidArgument if exc.invalid else FailedPrecondition)(str(exc)) from None
        except StoreError as exc:
            raise FailedPrecondition(str(exc)) from None
        return pb.ApplyPolicyResponse(
            policies=[pb.PolicyInfo(**i) for i in infos],
            cgroup_changes=enacted.changes if enacted else (),
        )

    @unary
    @authorized
    def RemovePolicy(self, request, who: Access):
        who.require_admin("remove policies")
        try:
            info = self.policies.remove(request.kind, request.name)
        except KeyError:
            raise NotFound(f"no {request.kind or 'policy'} {request.name}") from None
        except (PolicyError, StoreError) as exc:
            raise FailedPrecondition(str(exc)) from None
        return pb.RemovePolicyResponse(removed=pb.PolicyInfo(**info))

    @unary
    @authorized
    def ListPolicies(self, request, who: Access):
        who.require_admin("list policies")
        return pb.ListPoliciesResponse(policies=[pb.PolicyInfo(**i) for i in self.policies.list()])

    @unary
    @authorized
    def Explain(self, request, who: Access):
        self._task(request.id, who)
        try:
            ex = self.scheduler.explain(request.id)
        except KeyError:
            raise NotFound(f"no task {request.id}") from None
        doc = ex.as_dict()
        return pb.ExplainResponse(
            verdicts=[
                pb.NodeVerdict(
                    node=node,
                    fits=v["feasible"],
                    reason=v.get("reason", ""),
                    kind=v.get("kind", ""),
                    score=v.get("score", 0.0),
                )
                for node, v in doc["nodes"].items()
            ],
            pending=doc["pending"],
            policy=doc["policy"] or "",
            detail_json=json.dumps(doc),
        )

    @unary
    @authorized
    def Inventory(self, request, who: Access):
        return pb.InventoryResponse(json=json.dumps(self.scheduler.node.to_dict()))

    @unary
    @authorized
    def Health(self, request, who: Access):
        return pb.HealthResponse(
            status=self.trouble() or "ok",
            version=__version__,
            pid=os.getpid(),
            uptime_s=time.monotonic() - self.started,
            socket=str(self.info.get("socket", "")),
            state_dir=str(self.info.get("state_dir", "")),
            metrics_addr=str(self.info.get("metrics_addr", "")),
            pool_json=str(self.info.get("pool", "")),
        )


__all__ = ["AgentService", "task_message"]
