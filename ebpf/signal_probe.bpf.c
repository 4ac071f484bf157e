// SPDX-License-Identifier: GPL-2.0
/* Preempt one thread with a signal from a perf event: attached to a per-thread
 * cpu-clock event, the program sends SIGURG to the interrupted thread when it is
 * the target. bpf_send_signal_thread() signals `current`, i.e. the thread the
 * sample interrupted, so the event must be opened on that thread. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

#define SIGURG 23

enum { SENT, FAILED, LAST_ERROR, RESULT_MAX };

/* [0] = thread id to signal; 0 = none. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} target SEC(".maps");

/* SENT / FAILED counters and the last helper error (positive errno). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RESULT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} results SEC(".maps");

SEC("perf_event")
int on_tick(struct bpf_perf_event_data *ctx)
{
	__u32 zero = 0, idx, *tid;
	__u64 *v;
	long ret;

	tid = bpf_map_lookup_elem(&target, &zero);
	if (!tid || !*tid || (__u32)bpf_get_current_pid_tgid() != *tid)
		return 0;
	ret = bpf_send_signal_thread(SIGURG);
	idx = ret ? FAILED : SENT;
	v = bpf_map_lookup_elem(&results, &idx);
	if (v)
		__sync_fetch_and_add(v, 1);
	if (ret) {
		idx = LAST_ERROR;
		v = bpf_map_lookup_elem(&results, &idx);
		if (v)
			*v = -ret;
	}
	return 0;
}
