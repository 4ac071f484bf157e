/* SPDX-License-Identifier: GPL-2.0 */
/* What user space reads of sched_trace.bpf.c: the ring-buffer record (also the
 * record of the trace file, agent/trace/fmt.py RECORD) and the enums that index the
 * maps. The Python layouts are checked against the object's BTF by
 * tests/unit/test_bpf_layout.py: change both sides together. */
#ifndef XH_SCHED_TRACE_H
#define XH_SCHED_TRACE_H

/* 80 bytes; the trace file format stores these as they are. */
struct xh_sched_event {
	__u64 ts_ns;       /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 cpu;
	__u16 type;        /* enum xh_event_type */
	__u16 ustack;      /* switch: prev's user stack id + 1 (0: none) */
	__u32 prev_pid;    /* switch: prev; waking/wakeup: current; exit: the task; fork: parent */
	__u32 prev_tgid;
	__u32 next_pid;    /* switch: next; waking/wakeup: the woken task; fork: child */
	__u32 next_tgid;
	__s32 prev_prio;
	__s32 next_prio;
	__u32 prev_state;  /* switch: the kernel's sched_switch prev_state value */
	__u32 aux;         /* switch: prev's kernel stack id + 1 (0: none); waking/wakeup: task_cpu;
	                    * exit: group_dead */
	char prev_comm[16];
	char next_comm[16];
};

enum xh_event_type { EV_SWITCH = 1, EV_WAKEUP, EV_WAKEUP_NEW, EV_EXIT, EV_FORK, EV_WAKING };
/* trace_config[CFG_MODE] */
enum xh_trace_filter { FILTER_ALL, FILTER_CGROUP, FILTER_PIDS };
/* trace_config keys */
enum xh_trace_cfg { CFG_MODE, CFG_CGROUP_ID, CFG_WAKEUP_BYTES, CFG_STACKS, CFG_MAX };
/* trace_config[CFG_STACKS] bits; STACKS_ONLY: take the stacks and write no record (what the
 * stacks alone cost: the floor of `xhagent bench trace --stacks`) */
enum xh_trace_stacks { STACKS_KERNEL = 1, STACKS_USER = 2, STACKS_ONLY = 4 };
/* counts keys (per-CPU) */
enum xh_trace_count { COUNT_EVENTS, COUNT_DROPPED, COUNT_STACKS_LOST, COUNT_MAX };
/* the stacks map: frames kept of a stack (the kernel's PERF_MAX_STACK_DEPTH), stacks (an id
 * + 1 fits a record's ustack) */
#define XH_STACK_DEPTH 127
#define XH_STACKS_MAX 16384
/* the tgids map: processes whose stacks were taken since user space last looked */
#define XH_TGIDS_MAX 4096

#endif
