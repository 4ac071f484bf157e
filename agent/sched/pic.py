"""Priority-inversion compensation (seed 003, 3.1): deadlines are lent along resource waits.

A job that holds a resource an earlier-deadline job waits for runs with the waiter's
deadline until it releases the resource; then its own deadline is back. Without this,
EDF lets any job with a deadline between the two preempt the holder, and the waiter
misses for work it never depended on.

Jobs take all their resources at once (`acquire`), so a holder never waits while holding
and boosts are one level deep in the simulator; `effective_deadline` still follows chains
(a holder that also waits passes its inherited deadline on) for callers that lock
incrementally.
"""

from __future__ import annotations

from collections import defaultdict

from .job import Job


class ResourceTable:
    def __init__(self):
        self.holder: dict[str, Job] = {}  # resource -> job holding it
        self.waiters: dict[str, dict[str, Job]] = defaultdict(
            dict
        )  # resource -> waiting jobs by name
        self.waiting_on: dict[str, set[str]] = defaultdict(
            set
        )  # job name -> resources it waits for

    def blockers(self, job: Job) -> set[str]:
        """Resources `job` needs that someone else holds."""
        return {r for r in job.holds if r in self.holder and self.holder[r].name != job.name}

    def acquire(self, job: Job) -> bool:
        """Take every resource `job` holds, or none; when blocked, `job` becomes a waiter."""
        blocked = self.blockers(job)
        if blocked:
            for r in blocked:
                self.waiters[r][job.name] = job
            self.waiting_on[job.name] = blocked
            return False
        for r in job.holds:
            self.holder[r] = job
        self._stop_waiting(job)
        return True

    def release(self, job: Job) -> list[Job]:
        """Give back `job`'s resources; returns the waiters that may now proceed (they retry
        `acquire`), and the holder's inherited deadline ends with the release."""
        woken: dict[str, Job] = {}
        for r in [r for r, h in self.holder.items() if h.name == job.name]:
            del self.holder[r]
            woken.update(self.waiters.pop(r, {}))
        self._stop_waiting(job)
        for waiter in woken.values():
            self._stop_waiting(waiter)
        return sorted(woken.values(), key=lambda j: (j.deadline, j.name))

    def _stop_waiting(self, job: Job) -> None:
        for r in self.waiting_on.pop(job.name, ()):
            self.waiters.get(r, {}).pop(job.name, None)

    def effective_deadline(self, job: Job) -> float:
        """min(own deadline, effective deadline of every job waiting on what `job` holds)."""
        return self._effective(job, set())

    def _effective(self, job: Job, seen: set[str]) -> float:
        seen.add(job.name)
        best = job.deadline
        for r, holder in self.holder.items():
            if holder.name != job.name:
                continue
            for waiter in self.waiters.get(r, {}).values():
                if waiter.name not in seen:
                    best = min(best, self._effective(waiter, seen))
        return best

    def holders_boosted_by(self, waiter: Job) -> list[Job]:
        """The holders whose effective deadline may have changed because `waiter` waits (or
        stopped waiting): the simulator re-keys them in its ready queue."""
        return [self.holder[r] for r in self.waiting_on.get(waiter.name, ()) if r in self.holder]
