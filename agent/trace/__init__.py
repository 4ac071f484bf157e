"""Scheduler tracing: eBPF recording into a compact binary file (`fmt`), and what is
read out of one: perf/ftrace/Chrome exports, statistics, a per-CPU heatmap."""
