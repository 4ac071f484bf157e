"""Exclusive resources on the node, and priority-inversion compensation (edf-pic) by real
cgroup weights.

A task's `spec.resources` are held from its start to its end: by every task that holds a
placement (Starting, Running, Frozen: a frozen holder still holds them). A Pending task
that needs one another task holds waits, with the reason `ResourceHeld`, whatever room
the node has.

Under `edf-pic` the holder of a resource that an earlier-deadline task waits for runs
with that waiter's class weights (`cpu.weight`, `io.weight`, the larger of its own and
each such waiter's) until no such task waits: it released the resource, or the waiter
left. Who lends to whom is the simulator's own rule (`sched.pic.ResourceTable`, the
deadline a holder inherits through resource waits), applied to the same jobs the loop
orders by; this module only says which weights each holder should run with
(`boosted_weights`), and the scheduler writes the difference to the leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ...sched.job import Job
from ...sched.pic import ResourceTable

Weights = tuple[int, int]  # (cpu.weight, io.weight)


def holders(held: Iterable[tuple[str, Iterable[str]]]) -> dict[str, str]:
    """resource -> the task holding it, from (task id, its resources) of the tasks that
    hold a placement."""
    out: dict[str, str] = {}
    for task_id, resources in held:
        for r in resources:
            out.setdefault(r, task_id)
    return out


def blocker(resources: Iterable[str], held: Mapping[str, str], me: str) -> tuple[str, str] | None:
    """(resource, its holder) of the first of `resources` another task holds; None: free."""
    for r in resources:
        holder = held.get(r)
        if holder is not None and holder != me:
            return r, holder
    return None


@dataclass(frozen=True)
class Lent:
    """A holder that earlier-deadline tasks wait for: the weights it runs with meanwhile
    (its own where no lender's class weighs more) and the deadline it stands by."""

    weights: Weights
    own: Weights  # its class's
    lenders: tuple[str, ...]  # the waiting tasks it runs for, by id
    deadline_ns: int  # the earliest of theirs: its inherited deadline

    @property
    def boosted(self) -> bool:
        return self.weights != self.own


def boosted_weights(
    holding: Iterable[Job],
    waiting: Iterable[Job],
    weights_of: Callable[[str], Weights],
) -> dict[str, Lent]:
    """Holder id -> what it is lent, for the holders that an earlier-deadline waiter lends
    to (ResourceTable.effective_deadline below the holder's own); `weights_of(task id)`:
    the weights of a task's class. Jobs are named by task id; a job's `holds` are its
    resources."""
    table = ResourceTable()
    holding = list(holding)
    for job in holding:
        table.acquire(job)
    for job in waiting:
        table.acquire(job)  # blocked: it waits for what the holders hold
    out: dict[str, Lent] = {}
    for holder in holding:
        inherited = table.effective_deadline(holder)
        if not inherited < holder.deadline:
            continue
        lenders = sorted(
            {
                w.name
                for r in holder.holds
                if table.holder.get(r) is holder
                for w in table.waiters.get(r, {}).values()
                if table.effective_deadline(w) < holder.deadline
            }
        )
        own = weights_of(holder.name)
        lent = [weights_of(w) for w in lenders]
        cpu = max([own[0], *(w[0] for w in lent)])
        io = max([own[1], *(w[1] for w in lent)])
        out[holder.name] = Lent((cpu, io), own, tuple(lenders), int(inherited))
    return out


__all__ = ["Lent", "Weights", "blocker", "boosted_weights", "holders"]
