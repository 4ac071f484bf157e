// SPDX-License-Identifier: GPL-2.0
/* Run-queue latency per cgroup: how long a task waits between becoming runnable
 * (woken, newly forked, or preempted while still runnable) and getting a CPU, in log2
 * histograms keyed by the task's cgroup v2 id. Only groups that user space has given
 * an entry in `hists` are counted; every other task costs one failed lookup per
 * switch, and nothing is stored for it. */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"
#include "runqlat.h"

char LICENSE[] SEC("license") = "GPL";

XH_BTF_EXPORT(struct runq_hist, hist);
XH_BTF_EXPORT(enum xh_runq_const, consts);

#define MAX_GROUPS 1024
/* Tasks of watched groups waiting for a CPU at one time. LRU, so that an entry
 * orphaned by a race (a group unwatched between enqueue and switch-in) cannot fill
 * it: it is evicted instead of refusing new tasks. */
#define MAX_QUEUED 16384
#define TASK_RUNNING 0

/* cgroup id -> histogram; see runqlat.h */
XH_MAP(hists, BPF_MAP_TYPE_HASH, MAX_GROUPS, __u64, struct runq_hist);
/* thread id -> bpf_ktime_get_ns() when it became runnable */
XH_MAP(enqueued, BPF_MAP_TYPE_LRU_HASH, MAX_QUEUED, __u32, __u64);

/* The task's cgroup in the default (v2) hierarchy: kernfs id = the directory's
 * inode number, what user space gets from stat(2). Read through the task because
 * bpf_get_current_cgroup_id() knows only the current task, and here the task of
 * interest is the woken or the next one. */
static __always_inline __u64 task_cgroup(struct task_struct *t)
{
	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

static __always_inline void enqueue(struct task_struct *t)
{
	__u32 pid = t->pid;
	__u64 cgid, now;

	if (!pid)  /* the idle tasks, one per CPU, all pid 0 */
		return;
	cgid = task_cgroup(t);
	if (!bpf_map_lookup_elem(&hists, &cgid))
		return;
	now = bpf_ktime_get_ns();
	bpf_map_update_elem(&enqueued, &pid, &now, BPF_ANY);
}

/* floor(log2(v)), 0 for 0: bcc's branch-free log2 (no loops for the verifier). */
static __always_inline __u32 log2_u32(__u32 v)
{
	__u32 shift, r;

	r = (v > 0xFFFF) << 4;
	v >>= r;
	shift = (v > 0xFF) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xF) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 hi = v >> 32;

	return hi ? log2_u32(hi) + 32 : log2_u32(v);
}

static __always_inline void dequeue(struct task_struct *t)
{
	__u32 pid = t->pid, slot;
	struct runq_hist *h;
	__u64 *start, cgid, wait, idx;

	start = bpf_map_lookup_elem(&enqueued, &pid);
	if (!start)
		return;
	wait = bpf_ktime_get_ns() - *start;
	bpf_map_delete_elem(&enqueued, &pid);
	/* checked again: the group may have been unwatched (its histogram deleted)
	 * or the task moved to another group while it waited */
	cgid = task_cgroup(t);
	h = bpf_map_lookup_elem(&hists, &cgid);
	if (!h || (__s64)wait < 0)
		return;
	slot = log2_u64(wait / 1000);
	if (slot >= RUNQ_SLOTS)
		slot = RUNQ_SLOTS - 1;
	/* Linux 6.1's verifier loses the clamp's bound in the code the compiler makes of it
	 * ("R2 unbounded memory access"): the index is checked again at the access, as a
	 * 64-bit value behind a barrier the compiler cannot see through. */
	idx = slot;
	asm volatile("" : "+r"(idx));
	if (idx >= RUNQ_SLOTS)
		return;
	/* the same group's tasks run on every CPU at once */
	__sync_fetch_and_add(&h->slots[idx], 1);
	__sync_fetch_and_add(&h->sum_ns, wait);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *p)
{
	enqueue(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_wakeup_new, struct task_struct *p)
{
	enqueue(p);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	/* Preempted (or yielding) while runnable: it stays on the run queue and waits
	 * again from now. A task that blocked is enqueued by its next wakeup. */
	if (preempt || prev_state == TASK_RUNNING)
		enqueue(prev);
	dequeue(next);
	return 0;
}
