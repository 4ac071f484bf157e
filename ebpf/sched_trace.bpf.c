// SPDX-License-Identifier: GPL-2.0
/* Scheduler tracing: sched_switch, sched_waking, sched_wakeup(_new), sched_process_exit and
 * sched_process_fork as fixed-size records in a BPF ring buffer, filtered by
 * nothing, a cgroup subtree, or a set of pids/tgids that follows forks.
 * tp_btf programs are the default; raw_tp twins are the fallback where tp_btf
 * cannot attach (the loader picks one set and disables the other). */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"
#include "sched_trace.h"

char LICENSE[] SEC("license") = "GPL";

XH_BTF_EXPORT(struct xh_sched_event, record);
XH_BTF_EXPORT(enum xh_event_type, event_type);
XH_BTF_EXPORT(enum xh_trace_filter, filter);
XH_BTF_EXPORT(enum xh_trace_cfg, cfg);
XH_BTF_EXPORT(enum xh_trace_count, count);
XH_BTF_EXPORT(enum xh_trace_stacks, stacks);

/* TASK_REPORT and friends from include/linux/sched.h */
#define TASK_REPORT 0x7f
#define TASK_IDLE_STATE 0x402
#define TASK_RTLOCK_WAIT 0x1000
#define TASK_REPORT_IDLE 0x80
#define TASK_REPORT_MAX 0x100
#define MAX_CGROUP_DEPTH 32
#define XH_EFAULT 14  /* errno.h is not for BPF programs */

XH_ARRAY(trace_config, CFG_MAX, __u64);

/* pids and tgids being traced (FILTER_PIDS); forks of a traced task are added. */
XH_MAP(pids, BPF_MAP_TYPE_HASH, 65536, __u32, __u8);

XH_PERCPU_COUNTERS(counts, COUNT_MAX);

XH_RINGBUF(events, 16 << 20);

/* Kernel and user stacks of tasks switched out (CFG_STACKS), by id: a switch record's aux is
 * its kernel stack's id + 1 and its ustack its user stack's (0: none). Ids are never reused
 * (no BPF_F_REUSE_STACKID), so a record never names another stack; a stack that finds its
 * bucket taken is counted lost. */
typedef __u64 xh_stack_t[XH_STACK_DEPTH];
XH_MAP(stacks, BPF_MAP_TYPE_STACK_TRACE, XH_STACKS_MAX, __u32, xh_stack_t);

/* The tgids whose stacks were taken: user space reads each one's cgroup and, for user
 * stacks, its mappings while it lives (a user stack's addresses mean nothing without them),
 * then deletes the key, so the map holds the processes seen since it last looked. */
XH_MAP(tgids, BPF_MAP_TYPE_HASH, XH_TGIDS_MAX, __u32, __u8);

static __always_inline bool in_cgroup(struct task_struct *t, __u64 want)
{
	struct cgroup *cg = BPF_CORE_READ(t, cgroups, dfl_cgrp);
	int level = BPF_CORE_READ(cg, level);

	for (int i = 0; i < MAX_CGROUP_DEPTH; i++) {
		struct cgroup *anc;

		if (i > level)
			break;
		anc = BPF_CORE_READ(cg, ancestors[i]);
		if (BPF_CORE_READ(anc, kn, id) == want)
			return true;
	}
	return false;
}

static __always_inline bool pid_traced(bool btf, struct task_struct *t)
{
	__u32 pid = btf ? t->pid : BPF_CORE_READ(t, pid);
	__u32 tgid = btf ? t->tgid : BPF_CORE_READ(t, tgid);

	return bpf_map_lookup_elem(&pids, &pid) || bpf_map_lookup_elem(&pids, &tgid);
}

static __always_inline bool traced(bool btf, struct task_struct *t)
{
	switch (xh_get(&trace_config, CFG_MODE)) {
	case FILTER_CGROUP:
		return in_cgroup(t, xh_get(&trace_config, CFG_CGROUP_ID));
	case FILTER_PIDS:
		return pid_traced(btf, t);
	default:
		return true;
	}
}

/* tp_btf arguments are trusted BTF pointers: plain loads (CO-RE relocated) are
 * much cheaper than a bpf_probe_read_kernel() per field, which raw_tp needs.
 * `btf` is a constant at every call site, so each program keeps one branch. */
static __always_inline void read_task(bool btf, struct task_struct *t, __u32 *pid, __u32 *tgid,
				      __s32 *prio, char *comm)
{
	if (btf) {
		*pid = t->pid;
		*tgid = t->tgid;
		*prio = t->prio;
		__builtin_memcpy(comm, t->comm, 16);  /* always NUL-terminated */
	} else {
		*pid = BPF_CORE_READ(t, pid);
		*tgid = BPF_CORE_READ(t, tgid);
		*prio = BPF_CORE_READ(t, prio);
		bpf_probe_read_kernel(comm, 16, &t->comm);
	}
}

static __always_inline void fill_prev(bool btf, struct xh_sched_event *e, struct task_struct *t)
{
	read_task(btf, t, &e->prev_pid, &e->prev_tgid, &e->prev_prio, e->prev_comm);
}

static __always_inline void fill_next(bool btf, struct xh_sched_event *e, struct task_struct *t)
{
	read_task(btf, t, &e->next_pid, &e->next_tgid, &e->next_prio, e->next_comm);
}

static __always_inline struct xh_sched_event *reserve(enum xh_event_type type)
{
	struct xh_sched_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		xh_bump(&counts, COUNT_DROPPED);
		return NULL;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_ns();
	e->cpu = bpf_get_smp_processor_id();
	e->type = type;
	return e;
}

/* Wake the consumer only once a batch is waiting: a wakeup per record would
 * cost more than the record. The consumer also polls with a timeout. */
static __always_inline void submit(struct xh_sched_event *e)
{
	__u64 batch = xh_get(&trace_config, CFG_WAKEUP_BYTES);
	__u64 flags = BPF_RB_NO_WAKEUP;

	if (!batch || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= batch)
		flags = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(e, flags);
	xh_bump(&counts, COUNT_EVENTS);
}

/* __trace_sched_switch_state() of kernel/sched: what the tracepoint prints. */
static __always_inline __u32 switch_state(bool btf, bool preempt, unsigned int prev_state,
					  struct task_struct *prev)
{
	unsigned int state;

	if (preempt)
		return TASK_REPORT_MAX;
	state = (prev_state | (btf ? prev->exit_state : BPF_CORE_READ(prev, exit_state))) & TASK_REPORT;
	if ((prev_state & TASK_IDLE_STATE) == TASK_IDLE_STATE)
		state = TASK_REPORT_IDLE;
	if (prev_state & TASK_RTLOCK_WAIT)
		state = 2;  /* TASK_UNINTERRUPTIBLE */
	/* 1 << (fls(state) - 1); state <= TASK_REPORT_IDLE (BPF has no clz) */
	for (int bit = 7; bit >= 0; bit--)
		if (state & (1u << bit))
			return 1u << bit;
	return 0;
}

static __always_inline int on_switch(void *ctx, bool btf, bool preempt, struct task_struct *prev,
				     struct task_struct *next, unsigned int prev_state)
{
	struct xh_sched_event *e;
	bool prev_traced = traced(btf, prev);
	__u64 kinds;

	if (!prev_traced && !traced(btf, next))
		return 0;
	kinds = xh_get(&trace_config, CFG_STACKS);
	if (kinds & STACKS_ONLY) {  /* the cost of the stacks alone: take them, record nothing */
		if (prev_traced && BPF_CORE_READ(prev, pid)) {
			if (kinds & STACKS_KERNEL)
				bpf_get_stackid(ctx, &stacks, 0);
			if (kinds & STACKS_USER)
				bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK);
		}
		return 0;
	}
	e = reserve(EV_SWITCH);
	if (!e)
		return 0;
	fill_prev(btf, e, prev);
	fill_next(btf, e, next);
	e->prev_state = switch_state(btf, preempt, prev_state, prev);
	/* current is still prev here: its stacks are where it leaves the CPU */
	kinds = prev_traced && e->prev_pid ? kinds : 0;
	if (kinds & STACKS_KERNEL) {
		long id = bpf_get_stackid(ctx, &stacks, 0);

		if (id >= 0)
			e->aux = (__u32)id + 1;
		else
			xh_bump(&counts, COUNT_STACKS_LOST);
	}
	if (kinds & STACKS_USER) {
		long id = bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK);

		if (id >= 0 && id < XH_STACKS_MAX)
			e->ustack = (__u16)(id + 1);
		else if (id != -XH_EFAULT)  /* a kernel thread: no user stack */
			xh_bump(&counts, COUNT_STACKS_LOST);
	}
	if (kinds) {
		__u32 tgid = e->prev_tgid;  /* 6.1 takes no ring record memory as a key */
		__u8 one = 1;

		bpf_map_update_elem(&tgids, &tgid, &one, BPF_NOEXIST);
	}
	submit(e);
	return 0;
}

static __always_inline int on_wakeup(bool btf, struct task_struct *p, __u16 type)
{
	struct xh_sched_event *e;

	if (!traced(btf, p))
		return 0;
	e = reserve(type);
	if (!e)
		return 0;
	if (btf)
		fill_prev(btf, e, bpf_get_current_task_btf());
	else
		fill_prev(btf, e, (struct task_struct *)bpf_get_current_task());
	fill_next(btf, e, p);
	/* task_cpu(p), as the tracepoint prints it */
	e->aux = btf ? p->thread_info.cpu : BPF_CORE_READ(p, thread_info.cpu);
	submit(e);
	return 0;
}

/* group_dead is read from the task, not taken from the tracepoint: Linux gave
 * sched_process_exit a group_dead argument only in 6.16, and on older kernels (Debian 12's
 * 6.1) a program that reads a second argument is refused (tp_btf: "doesn't have 2-th
 * argument") or cannot attach (raw_tp: EINVAL). do_exit() has already decremented
 * signal->live when the tracepoint fires, so the thread that took it to 0 sees 0; a
 * sibling exiting in the same instant may see 0 too and be reported group_dead as well. */
static __always_inline int on_exit(bool btf, struct task_struct *p)
{
	struct xh_sched_event *e;

	if (!traced(btf, p))
		return 0;
	e = reserve(EV_EXIT);
	if (!e)
		return 0;
	fill_prev(btf, e, p);
	e->aux = (btf ? p->signal->live.counter : BPF_CORE_READ(p, signal, live.counter)) == 0;
	submit(e);
	return 0;
}

static __always_inline int on_fork(bool btf, struct task_struct *parent, struct task_struct *child)
{
	struct xh_sched_event *e;
	__u8 one = 1;

	if (!traced(btf, parent))
		return 0;
	if (xh_get(&trace_config, CFG_MODE) == FILTER_PIDS) {
		__u32 pid = btf ? child->pid : BPF_CORE_READ(child, pid);

		bpf_map_update_elem(&pids, &pid, &one, BPF_ANY);
	}
	e = reserve(EV_FORK);
	if (!e)
		return 0;
	fill_prev(btf, e, parent);
	fill_next(btf, e, child);
	submit(e);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(btf_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	return on_switch(ctx, true, preempt, prev, next, prev_state);
}

/* sched_waking runs in the waker's context; sched_wakeup may not: a wakeup of a task whose
 * CPU is idle (or shares no cache with the waker's) is queued to that CPU and completed
 * there, where current is whatever runs there, often the idle task. */
SEC("tp_btf/sched_waking")
int BPF_PROG(btf_waking, struct task_struct *p)
{
	return on_wakeup(true, p, EV_WAKING);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(btf_wakeup, struct task_struct *p)
{
	return on_wakeup(true, p, EV_WAKEUP);
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(btf_wakeup_new, struct task_struct *p)
{
	return on_wakeup(true, p, EV_WAKEUP_NEW);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(btf_exit, struct task_struct *p)
{
	return on_exit(true, p);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(btf_fork, struct task_struct *parent, struct task_struct *child)
{
	return on_fork(true, parent, child);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(raw_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	return on_switch(ctx, false, preempt, prev, next, prev_state);
}

SEC("raw_tp/sched_waking")
int BPF_PROG(raw_waking, struct task_struct *p)
{
	return on_wakeup(false, p, EV_WAKING);
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(raw_wakeup, struct task_struct *p)
{
	return on_wakeup(false, p, EV_WAKEUP);
}

SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(raw_wakeup_new, struct task_struct *p)
{
	return on_wakeup(false, p, EV_WAKEUP_NEW);
}

SEC("raw_tp/sched_process_exit")
int BPF_PROG(raw_exit, struct task_struct *p)
{
	return on_exit(false, p);
}

SEC("raw_tp/sched_process_fork")
int BPF_PROG(raw_fork, struct task_struct *parent, struct task_struct *child)
{
	return on_fork(false, parent, child);
}
