// SPDX-License-Identifier: GPL-2.0
/* Preempt one thread with a signal from a perf event: attached to a per-thread
 * cpu-clock event, the program sends SIGURG to the interrupted thread when it is
 * the target. bpf_send_signal_thread() signals `current`, i.e. the thread the
 * sample interrupted, so the event must be opened on that thread. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"
#include "signal_probe.h"

char LICENSE[] SEC("license") = "GPL";

XH_BTF_EXPORT(enum xh_signal_result, result);

#define SIGURG 23

/* [0] = thread id to signal; 0 = none. */
XH_SCALAR_ARRAY(target, __u32);

/* SENT / FAILED counters and the last helper error (positive errno). */
XH_ARRAY(results, RESULT_MAX, __u64);

SEC("perf_event")
int on_tick(struct bpf_perf_event_data *ctx)
{
	__u32 zero = 0, *tid;
	long ret;

	tid = bpf_map_lookup_elem(&target, &zero);
	if (!tid || !*tid || (__u32)bpf_get_current_pid_tgid() != *tid)
		return 0;
	ret = bpf_send_signal_thread(SIGURG);
	xh_add(&results, ret ? FAILED : SENT, 1);
	if (ret)
		xh_set(&results, LAST_ERROR, -ret);
	return 0;
}
