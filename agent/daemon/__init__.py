"""The agent daemon (`xhagent run`): durable task state, the workload shim, the executor
that runs tasks in cgroup leaves, and the gRPC API it serves."""
