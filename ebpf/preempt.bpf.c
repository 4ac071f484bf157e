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
#include "maps.bpf.h"
#include "preempt.h"

char LICENSE[] SEC("license") = "GPL";

XH_BTF_EXPORT(struct slice_state, slice_state);
XH_BTF_EXPORT(enum xh_preempt_count, count);

#define SIGURG 23
#define EBUSY 16

/* thread id -> its armed slice */
XH_MAP(armed, BPF_MAP_TYPE_HASH, 4096, __u32, struct slice_state);

XH_ARRAY(counts, COUNT_MAX, __u64);

SEC("perf_event")
int on_cpu_clock(struct bpf_perf_event_data *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
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
		xh_add(&counts, SENT, 1);
		return 0;
	}
	s->failed++;
	s->last_error = -ret;
	xh_add(&counts, FAILED, 1);
	if (ret == -EBUSY)
		xh_add(&counts, FAILED_EBUSY, 1);
	xh_set(&counts, LAST_ERROR, -ret);
	return 0;
}
