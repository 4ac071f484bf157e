"""The scheduling core's queueing and preemption algorithms, and a simulator to compare them.

Pure code: no root, no kernel. A `Job` is the scheduler's view of a task (times in
integer nanoseconds); queues order jobs (fifo, priority, edf, edf-pic, fair, mlq), `pic`
lends deadlines across resource waits, `dwps` decides GPU-memory preemption from
fragmentation, `fair` keeps vruntimes, `snapshot` commits decisions by compare-and-set,
and `simulator` runs a workload through any of them.
"""

from .job import Job

__all__ = ["Job"]
