"""The agent's per-CPU worker pool (`xhagent.runtime`): pinned worker processes running tasks
on reusable contexts, fed by shared-memory run queues with work stealing, preempted at safe
points by a BPF time slice or a CPU-time timer."""
