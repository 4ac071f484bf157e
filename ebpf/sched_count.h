/* SPDX-License-Identifier: GPL-2.0 */
/* What user space reads of sched_count.bpf.c (agent/bpf/sched_count.py); checked
 * against the object's BTF by tests/unit/test_bpf_layout.py. */
#ifndef XH_SCHED_COUNT_H
#define XH_SCHED_COUNT_H

struct switch_event {
	__u64 ts_ns;     /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 cpu;
	__u32 prev_pid;  /* thread ids */
	__u32 next_pid;
	__u32 pad;
};

/* counts keys (per-CPU) */
enum xh_switch_count { COUNT_SWITCHES, COUNT_DROPPED, COUNT_MAX };

#endif
