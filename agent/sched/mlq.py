"""Multi-level queues with affinity labels (seed 003, 2.4) and hot/cold separation.

Levels are ordered, 0 first. A job goes to the first level whose `match_labels` are all
among its affinity labels; a level without labels is the fallback for jobs no labelled
level claims. Levels are served strictly in order and a job of a lower level number
preempts one of a higher: a latency-critical (hot) job therefore never waits behind bulk
(cold) work, only behind other hot jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .job import Job


@dataclass(frozen=True)
class Level:
    name: str
    match_labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return bool(self.match_labels) and all(
            labels.get(k) == v for k, v in self.match_labels.items()
        )


DEFAULT_LEVELS = (Level("hot", {"tier": "hot"}), Level("normal"), Level("cold", {"tier": "cold"}))


@dataclass
class MultiLevel:
    levels: tuple[Level, ...] = DEFAULT_LEVELS

    def __post_init__(self):
        if not self.levels:
            raise ValueError("a multi-level queue needs at least one level")
        fallbacks = [i for i, lvl in enumerate(self.levels) if not lvl.match_labels]
        # Without a fallback, unlabelled jobs go to the last (coldest) level.
        self._fallback = fallbacks[0] if fallbacks else len(self.levels) - 1

    def level_of(self, job: Job) -> int:
        for i, lvl in enumerate(self.levels):
            if lvl.matches(job.affinity):
                return i
        return self._fallback

    def name_of(self, job: Job) -> str:
        return self.levels[self.level_of(job)].name
