"""The daemon's hands on the kernel: task leaves in the agent's subtree, the shims that run
workloads, tasks' scheduler traces and the hosted worker pool. Nothing here imports the
scheduler loop or the API."""
