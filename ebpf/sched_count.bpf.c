// SPDX-License-Identifier: GPL-2.0
/* Count context switches per CPU and stream the switches of one process (tgid)
 * through a ring buffer. tp_btf needs neither tracefs nor kernel headers; CO-RE
 * relocates the task_struct field offsets on the running kernel. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"
#include "sched_count.h"

char LICENSE[] SEC("license") = "GPL";

XH_BTF_EXPORT(struct switch_event, record);
XH_BTF_EXPORT(enum xh_switch_count, count);

XH_PERCPU_COUNTERS(counts, COUNT_MAX);

/* [0] = tgid whose switches go to `events`; 0 = none. A map rather than .rodata
 * so that the target can change while attached. */
XH_SCALAR_ARRAY(target, __u32);

XH_RINGBUF(events, 1 << 20);

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	struct switch_event *e;
	__u32 zero = 0, *tgid;

	xh_bump(&counts, COUNT_SWITCHES);
	tgid = bpf_map_lookup_elem(&target, &zero);
	if (!tgid || !*tgid || (prev->tgid != *tgid && next->tgid != *tgid))
		return 0;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		xh_bump(&counts, COUNT_DROPPED);
		return 0;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->cpu = bpf_get_smp_processor_id();
	e->prev_pid = prev->pid;
	e->next_pid = next->pid;
	e->pad = 0;
	bpf_ringbuf_submit(e, 0);
	return 0;
}
