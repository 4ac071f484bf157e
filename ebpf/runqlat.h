/* SPDX-License-Identifier: GPL-2.0 */
/* What user space reads and writes of runqlat.bpf.c (agent/bpf/runqlat.py); checked
 * against the object's BTF by tests/unit/test_bpf_layout.py. */
#ifndef XH_RUNQLAT_H
#define XH_RUNQLAT_H

/* Log2 slots of microseconds: slot k holds waits of [2^k, 2^(k+1)) us (slot 0 also
 * holds waits under 1 us), and the last slot every wait of 2^(RUNQ_SLOTS-1) us (8.4 s)
 * or more. Microseconds, as bcc's runqlat prints them, so the two can be compared. */
enum xh_runq_const { RUNQ_SLOTS = 24 };

/* Value of the `hists` map, keyed by cgroup id. User space creates the entry (zeroed)
 * to watch a group and deletes it to stop: the program never creates one. There is
 * no separate count: it is the sum of the slots, which a read racing an update cannot
 * make disagree with the buckets. */
struct runq_hist {
	__u64 slots[RUNQ_SLOTS];
	__u64 sum_ns;  /* total wait, nanoseconds */
};

#endif
