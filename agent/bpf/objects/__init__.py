"""BPF objects compiled from ebpf/*.bpf.c at install time (package data)."""
