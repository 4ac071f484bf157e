// SPDX-License-Identifier: GPL-2.0
/* Preemption points for the coroutine pool: SIGURG to an armed thread once it has
 * run on-CPU longer than its slice since it was armed or reset, then re-armed.
 *
 * The program is attached to one cpu-clock perf event per armed thread. That
 * clock advances only while the thread runs, and each sample carries the CPU
 * time since the previous one (sample_period), so summing periods is on-CPU
 * runtime: a sleeping thread accumulates nothing and is never signalled.
 * bpf_send_signal_thread() signals `current`, the thread the sample interrupted. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

#define SIGURG 23
#define EBUSY 16

/* Keep in sync with agent/bpf/preempt.py (STATE). */
struct slice_state {
	__u64 slice_ns;    /* set by user space (arm) */
	__u64 runtime_ns;  /* on-CPU time since arm/reset/last signal; reset writes 0 */
	__u64 sent;
	__u64 failed;
	__u64 last_error;  /* positive errno of the last failure */
};

enum { SENT, FAILED, FAILED_EBUSY, LAST_ERROR, COUNT_MAX };

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);   /* thread id */
	__type(value, struct slice_state);
} armed SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, COUNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline void add(__u32 idx, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&counts, &idx);

	if (v)
		__sync_fetch_and_add(v, n);
}

SEC("perf_event")
int on_cpu_clock(struct bpf_perf_event_data *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), idx;
	struct slice_state *s;
	long ret;

	s = bpf_map_lookup_elem(&armed, &tid);
	if (!s || !s->slice_ns)
		return 0;
	/* Only this thread's own event reaches here; the element is updated from
	 * this thread's context alone (user space only resets it), so no atomics. */
	s->runtime_ns += ctx->sample_period;
	if (s->runtime_ns < s->slice_ns)
		return 0;
	s->runtime_ns = 0;
	ret = bpf_send_signal_thread(SIGURG);
	if (!ret) {
		s->sent++;
		add(SENT, 1);
		return 0;
	}
	s->failed++;
	s->last_error = -ret;
	add(FAILED, 1);
	if (ret == -EBUSY)
		add(FAILED_EBUSY, 1);
	idx = LAST_ERROR;
	{
		__u64 *v = bpf_map_lookup_elem(&counts, &idx);

		if (v)
			*v = -ret;
	}
	return 0;
}
