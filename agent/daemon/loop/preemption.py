"""Preemption in the daemon: the policy core chooses the victims (`choose_victims`), this
module stops them and brings frozen ones back.

A victim is frozen (`cgroup.freeze`, thawed back when it cannot be confirmed or recorded:
never a group left frozen without a record) or killed and requeued, each under an intent;
a frozen task keeps its memory and GPUs and gives its CPUs to the preemptor, and resumes,
highest standing first, once its CPUs are free again. Under `fair` the running tasks are
victims only once their time slice is over (fairness.py), and a frozen task of less
vruntime takes its CPUs back from them then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ...cpulist import format_cpulist
from ...policy.placement import Candidate, Demand, decide_demand
from ...policy.policy import choose
from ...policy.preemption import Standing as Victim
from ...policy.preemption import choose_victims
from ...policy.task import Task
from ..store import Placement, TaskRecord, TaskState, WaitReason
from .fairness import Fairness
from .lifecycle import Lifecycle, allocation_of
from .ranking import Ranking, standing_of

FREEZE_TIMEOUT_S = 2.0
KILL_TIMEOUT_S = 3.0


def preempt_for(
    lc: Lifecycle,
    rec: TaskRecord,
    task: Task,
    demand: Demand,
    policies,
    inherited: Callable[[str], int | None] = lambda task_id: None,
    fairness: Fairness | None = None,
) -> Candidate | None:
    """Freeze or kill the victims the core chooses so that `rec` fits; where it goes, or
    None (nothing to preempt, or a victim could not be stopped: then nothing changed
    for the preemptor, and the victims stopped so far stay stopped until thawed).
    `inherited(id)`: the deadline a running task holds for a waiter under edf-pic (its
    resource's earlier-deadline waiter's), which it stands by as a victim too: a holder
    frozen for a later deadline would keep the waiter waiting. Under `fair` (time-sliced)
    with `queueing`, only tasks whose slice is over (`fairness.due`) are victims."""
    match = choose(policies, task.label_map)
    rule = match.policy.preemption if match.policy else "lower-priority"
    mine = standing_of(task, rec.created_ns, policies)
    # `queueing`: the node's order decides, as the simulator's preemptive disciplines do
    ranking = Ranking(policies, fairness and fairness.share) if rule == "queueing" else None
    ranked = ranking is not None and (ranking.preemptive or ranking.time_sliced)
    sliced = ranked and ranking.time_sliced
    running = []
    node = lc.cluster.nodes[lc.node.name]
    for other in lc.store.list_tasks([TaskState.RUNNING], limit=1000):
        held = node.tasks.get(other.id)
        other_task = lc.spec(other.id)
        if held is None or other_task is None or not (held.cpus or held.gpus or held.tpus):
            continue  # holds nothing a placement could take (a shared task)
        if sliced and not (fairness is not None and fairness.due(other.id)):
            continue  # its slice runs on
        s = standing_of(other_task, other.created_ns, policies)
        lent = inherited(other.id)
        deadline = s.deadline_ns if lent is None else min(s.deadline_ns, lent)
        rank = ranking.key(other.id, other_task, other.created_ns, lent) if ranked else None
        running.append(
            Victim(held, s.priority, deadline, other_task.preemption, other.started_ns or 0, rank)
        )
    plan = choose_victims(
        rec.id,
        demand,
        lc.cluster,
        running,
        rule=rule,
        priority=mine.priority,
        deadline_ns=mine.deadline_ns,
        rank=ranking.key(rec.id, task, rec.created_ns) if ranked else None,
    )
    if plan is None:
        return None
    for victim in plan.victims:
        if not stop_victim(lc, victim, rec.id, sliced_by(fairness, victim) if sliced else ""):
            return None
    return decide_demand(rec.id, demand, lc.cluster).placed


def sliced_by(fairness: Fairness | None, victim: Victim) -> str:
    """What a victim of the fair order is told: its slice ended, and its vruntime then."""
    vr = fairness.vruntime_ns(victim.allocation.task) if fairness is not None else None
    return "slice ended" + (f" at vruntime {vr / 1e6:.1f} ms" if vr is not None else "")


def stop_victim(lc: Lifecycle, victim: Victim, preemptor: str, cause: str = "") -> bool:
    task_id = victim.allocation.task
    rec = lc.store.get(task_id)
    why = (f"{cause}: " if cause else "") + f"preempted by {preemptor}"
    if victim.mode == "freeze":
        intent = lc.store.begin_intent(task_id, "freeze", {"preempted_by": preemptor})
        try:
            lc.executor.leaf(task_id).freeze(timeout=FREEZE_TIMEOUT_S)  # thaws back on failure
        except (OSError, ValueError) as exc:
            lc.store.finish_intent(intent, f"failed: {exc}")
            lc.store.add_event("PreemptionFailed", f"{why}: {exc}", task_id=task_id)
            return False
        try:
            with lc.store.atomic():
                lc.store.transition(task_id, TaskState.FROZEN, expect=TaskState.RUNNING, note=why)
                lc.store.finish_intent(intent, "frozen")
        except BaseException:  # not recorded: never leave it frozen
            lc.executor.set_frozen(task_id, False)
            raise
        lc.cluster.release(task_id)
        lc.cluster.commit(replace(victim.allocation, cpus=()))
        return True
    intent = lc.store.begin_intent(task_id, "kill", {"preempted_by": preemptor})
    status = lc.kill(rec, KILL_TIMEOUT_S)
    reason = preempted_reason(lc, preemptor)
    lc.evict(rec, status, reason, why, preempted=True, intent=(intent, "killed"))
    return True


def preempted_reason(lc: Lifecycle, preemptor: str) -> WaitReason:
    return WaitReason("Preempted", lc.node.name, f"preempted by {preemptor}")


class FrozenTurns:
    """The frozen tasks of one step in the node's order, each thawed on its turn, which
    the placement of Pending tasks interleaves (`thaw_before` each Pending task's key): a
    frozen task resumes before the Pending tasks it ranks before, and after the others,
    so no task waits behind one the order ranks after it. It resumes on its own CPUs when
    they are free, else on any others its demand fits (`_where`); under `fair` with
    `preemption: queueing` it also takes its own back from the running tasks whose slice
    is over and that the order ranks after it: those are frozen in turn, as the simulator
    switches jobs at a slice end."""

    def __init__(self, lc: Lifecycle, policies, fairness: Fairness | None = None):
        self._lc, self._policies, self._fairness = lc, policies, fairness
        self._sliced = fairness is not None and fairness.active  # the order is fair's
        self._turns: list[tuple[tuple, TaskRecord]] = []
        frozen = lc.store.list_tasks([TaskState.FROZEN], limit=1000)
        if frozen:  # (most steps: none, and no order to make)
            self._ranking = Ranking(policies, fairness and fairness.share)
            keyed = [(self._ranking.key(r.id, lc.spec(r.id), r.created_ns), r) for r in frozen]
            self._turns = sorted(keyed, key=lambda kr: kr[0])

    @property
    def waiting(self) -> bool:
        """Whether a frozen task is still to take its turn this step."""
        return bool(self._turns)

    def thaw_before(self, key: tuple) -> None:
        """Thaw, on their turns, the frozen tasks ranked before `key`."""
        while self._turns and self._turns[0][0] < key:
            self._thaw(self._turns.pop(0)[1])

    def thaw_rest(self) -> None:
        while self._turns:
            self._thaw(self._turns.pop(0)[1])

    def _thaw(self, rec: TaskRecord) -> None:
        lc = self._lc
        placement = self._where(rec)
        if placement is None:
            return  # it waits: its CPUs are taken, and so are any others it could use
        intent = lc.store.begin_intent(rec.id, "thaw", {"cpus": list(placement.cpus)})
        try:
            # its leaf on the CPUs it resumes on, whatever a resume cut short left there
            lc.pin(rec.id, placement.cpus)
            lc.executor.leaf(rec.id).thaw(timeout=FREEZE_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            lc.cluster.release(rec.id)
            lc.cluster.commit(allocation_of(rec))
            lc.store.finish_intent(intent, f"failed: {exc}")
            lc.store.add_event("ThawFailed", str(exc), task_id=rec.id)
            return
        moved = {}
        note = "resumed"
        if placement != rec.placement:
            moved = {"placement": placement}
            note = f"resumed on CPUs {format_cpulist(placement.cpus)}: its own are taken"
        with lc.store.atomic():
            lc.store.transition(
                rec.id, TaskState.RUNNING, expect=TaskState.FROZEN, note=note, **moved
            )
            lc.store.finish_intent(intent, "thawed")

    def _where(self, rec: TaskRecord) -> Placement | None:
        """Where the frozen task resumes, held in the placement state: its own CPUs when
        they are free; else, for a task that holds no GPU or TPU (which stay where its
        work is), whatever CPUs placement gives its demand now, as the simulator resumes a
        job on any free slot; else, under fair, its own CPUs taken back from the tasks
        whose slice is over. None: nowhere yet (it keeps what it holds frozen)."""
        lc, cluster = self._lc, self._lc.cluster
        frozen, own = allocation_of(rec), allocation_of(replace(rec, state=TaskState.RUNNING))
        cluster.release(rec.id)
        try:
            cluster.commit(own)
            return rec.placement
        except ValueError:  # held by its preemptor or another task
            pass
        elsewhere = self._elsewhere(rec)
        if elsewhere is not None:
            resumed = replace(rec, state=TaskState.RUNNING, placement=elsewhere)
            cluster.commit(allocation_of(resumed))
            return elsewhere
        cluster.commit(frozen)
        if not self._sliced or not _take_back(
            lc, rec, own, self._ranking, self._fairness, self._policies
        ):
            return None
        cluster.release(rec.id)
        try:
            cluster.commit(own)
            return rec.placement
        except ValueError:  # (a victim of another kind kept a part)
            cluster.commit(frozen)
            return None

    def _elsewhere(self, rec: TaskRecord) -> Placement | None:
        """Other CPUs for a frozen task holding CPUs alone and no device, where its demand
        fits now; None where it holds a device or nothing fits."""
        placed = rec.placement
        task = self._lc.spec(rec.id)
        if task is None or placed.gpus or placed.tpus or task.requests.cpus is None:
            return None
        demand = Demand.of(task, choose(self._policies, task.label_map))
        got = decide_demand(rec.id, demand, self._lc.cluster).placed
        if got is None or not got.cpus or got.gpus or got.tpus:
            return None
        return replace(placed, node=got.node, cpus=tuple(got.cpus), memory=got.memory)


def _take_back(lc: Lifecycle, rec: TaskRecord, whole, ranking: Ranking, fairness, policies) -> bool:
    """Free the frozen task's CPUs of the running tasks its order lets it displace (with
    `preemption: queueing`): every holder's slice over and each ranked after it. False
    when there are none, one of them may not be displaced, or one could not be stopped."""
    task = lc.spec(rec.id)
    match = choose(policies, task.label_map)
    if (match.policy.preemption if match.policy else "") != "queueing":
        return False  # it waits for its CPUs to be free, as under any other order
    mine = ranking.key(rec.id, task, rec.created_ns)
    wanted = set(whole.cpus)
    victims = []
    for _, held in lc.cluster.placed():
        if held.task == rec.id or not wanted.intersection(held.cpus):
            continue
        other, other_task = lc.store.get(held.task), lc.spec(held.task)
        if other is None or other_task is None or other.state != TaskState.RUNNING:
            return False
        rank = ranking.key(other.id, other_task, other.created_ns)
        if other_task.preemption == "never" or not fairness.due(other.id) or not rank > mine:
            return False
        s = standing_of(other_task, other.created_ns, policies)
        victim = Victim(held, s.priority, s.deadline_ns, other_task.preemption, 0, rank)
        victims.append(victim)
    stopped = all(stop_victim(lc, v, rec.id, sliced_by(fairness, v)) for v in victims)
    return bool(victims) and stopped
