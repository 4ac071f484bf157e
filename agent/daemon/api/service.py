"""The `xhagent.v1.Agent` service: each RPC turned into a call on the scheduler loop or the
policy set, and back.

Served by grpc's asyncio server (transport.Server): the unary methods are plain functions
run on the servicer's executor (`transport.unary`); Watch and Logs are asyncio generators.

Status codes (transport.Failure): INVALID_ARGUMENT for input with FILE:LINE:COL errors,
NOT_FOUND for an unknown task or policy, FAILED_PRECONDITION for a refusal (a task that
already ended, the store full, a policy held by a file).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from ... import __version__
from ..loop.faults import Faults
from ..loop.ranking import Standing
from ..loop.scheduler import MAX_LIST_PAGE, RequestRefused, Scheduler
from ..loop.submission import InvalidTask
from ..policies.policy_set import PolicySet
from ..policies.sources import PolicyError
from ..store import StoreError, TaskRecord, parse_task_id
from .transport import FailedPrecondition, InvalidArgument, NotFound, unary
from .v1 import agent_pb2 as pb
from .v1 import agent_pb2_grpc

WATCH_POLL_S = 1.0  # a following Watch waits on a thread this long at most, then again
LOG_CHUNK = 64 * 1024
API_THREADS = 32


def _read_chunk(path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(LOG_CHUNK)
    except FileNotFoundError:
        return b""


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
    )
    msg.labels.update(rec.summary.labels)
    if rec.exit_code is not None:
        msg.exit_code = rec.exit_code
    if rec.signal is not None:
        msg.signal = rec.signal
    return msg


class AgentService(agent_pb2_grpc.AgentServicer):
    def __init__(self, scheduler: Scheduler, policies: PolicySet, info: dict, faults: Faults):
        self.scheduler = scheduler
        self.faults = faults
        self.policies = policies
        self.info = info  # socket, state_dir, metrics_addr for Health
        self.started = time.monotonic()
        # Each call's blocking part runs here; a following stream holds a thread only while
        # it waits (up to WATCH_POLL_S).
        self.executor = ThreadPoolExecutor(API_THREADS, thread_name_prefix="xhagent-api")

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _messages(self, recs: list[TaskRecord]) -> list[pb.Task]:
        standings = self.scheduler.standings(recs)
        return [task_message(r, s) for r, s in zip(recs, standings, strict=True)]

    def _task(self, task_id: str) -> TaskRecord:
        rec = self.scheduler.get(task_id)
        if rec is None:
            raise NotFound(f"no task {task_id}")
        return rec

    @unary
    def Submit(self, request):
        try:
            recs = self.scheduler.submit(
                request.source, request.file_name or "<submitted>", request.idempotency_key
            )
        except InvalidTask as exc:
            raise InvalidArgument(str(exc)) from None
        except StoreError as exc:
            raise FailedPrecondition(str(exc)) from None
        return pb.SubmitResponse(tasks=self._messages(recs))

    @unary
    def Get(self, request):
        return pb.GetResponse(task=self._messages([self._task(request.id)])[0])

    @unary
    def List(self, request):
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
                list(request.states), request.all, request.limit or MAX_LIST_PAGE, token
            )
        except ValueError as exc:  # a state that does not exist
            raise InvalidArgument(f"states: {exc}") from None
        return pb.ListResponse(tasks=self._messages(recs), next_page_token=next_token, total=total)

    @unary
    def Cancel(self, request):
        try:
            rec = self.scheduler.cancel(request.id)
        except KeyError:
            raise NotFound(f"no task {request.id}") from None
        except RequestRefused as exc:
            raise FailedPrecondition(str(exc)) from None
        return pb.CancelResponse(task=self._messages([rec])[0])

    # The two streams are asyncio generators: grpc cancels one whose client has gone at its
    # next await, so no thread waits for a reader that left. What blocks (the store, the
    # agent's lock, files) runs on the streams' own threads.
    async def Watch(self, request, context) -> AsyncIterator[pb.Event]:
        since = request.since_seq if request.HasField("since_seq") else None
        if since is None:
            since = await self._blocking(self.scheduler.last_seq)
        wait = WATCH_POLL_S if request.follow else 0.0
        while True:
            events = await self._blocking(
                self.scheduler.wait_events, since, request.task_id or None, wait
            )
            if not events and not request.follow:
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

    async def Logs(self, request, context) -> AsyncIterator[pb.LogChunk]:
        rec = await self._blocking(self.scheduler.get, request.id)
        if rec is None:
            await context.abort(NotFound.code, f"no task {request.id}")
        streams = {
            pb.LOG_STREAM_STDOUT: ["stdout"],
            pb.LOG_STREAM_STDERR: ["stderr"],
        }.get(request.stream, ["stdout", "stderr"])
        offsets = {name: request.offset for name in streams}
        run_dir = self.scheduler.executor.run_dir(request.id, max(rec.attempt, 1))
        kind = {"stdout": pb.LOG_STREAM_STDOUT, "stderr": pb.LOG_STREAM_STDERR}
        while True:
            sent = False
            for name in streams:
                data = await self._blocking(_read_chunk, run_dir / name, offsets[name])
                if data:
                    yield pb.LogChunk(stream=kind[name], data=data, offset=offsets[name])
                    offsets[name] += len(data)
                    sent = True
            if sent:
                continue
            if not request.follow or await self._blocking(self.scheduler.ended, request.id):
                return
            await self._blocking(self.scheduler.wait_change, 0.5)

    async def _blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    @unary
    def ApplyPolicy(self, request):
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
    def RemovePolicy(self, request):
        try:
            info = self.policies.remove(request.kind, request.name)
        except KeyError:
            raise NotFound(f"no {request.kind or 'policy'} {request.name}") from None
        except (PolicyError, StoreError) as exc:
            raise FailedPrecondition(str(exc)) from None
        return pb.RemovePolicyResponse(removed=pb.PolicyInfo(**info))

    @unary
    def ListPolicies(self, request):
        return pb.ListPoliciesResponse(policies=[pb.PolicyInfo(**i) for i in self.policies.list()])

    @unary
    def Explain(self, request):
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
    def Inventory(self, request):
        return pb.InventoryResponse(json=json.dumps(self.scheduler.node.to_dict()))

    @unary
    def Health(self, request):
        return pb.HealthResponse(
            status=self.faults.health() or "ok",
            version=__version__,
            pid=os.getpid(),
            uptime_s=time.monotonic() - self.started,
            socket=str(self.info.get("socket", "")),
            state_dir=str(self.info.get("state_dir", "")),
            metrics_addr=str(self.info.get("metrics_addr", "")),
            pool_json=str(self.info.get("pool", "")),
        )


__all__ = ["AgentService", "task_message"]
