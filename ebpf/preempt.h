/* SPDX-License-Identifier: GPL-2.0 */
/* What user space reads and writes of preempt.bpf.c (agent/bpf/preempt.py); checked
 * against the object's BTF by tests/unit/test_bpf_layout.py. */
#ifndef XH_PREEMPT_H
#define XH_PREEMPT_H

/* Value of the `armed` map, keyed by thread id. */
struct slice_state {
	__u64 slice_ns;    /* set by user space (arm) */
	__u64 runtime_ns;  /* on-CPU time since arm/reset/last signal; reset writes 0 */
	__u64 sent;
	__u64 failed;
	__u64 last_error;  /* positive errno of the last failure */
};

/* counts keys */
enum xh_preempt_count { SENT, FAILED, FAILED_EBUSY, LAST_ERROR, COUNT_MAX };

#endif
