/* SPDX-License-Identifier: GPL-2.0 */
/* What user space reads of signal_probe.bpf.c (agent/bpf/signal_probe.py); checked
 * against the object's BTF by tests/unit/test_bpf_layout.py. */
#ifndef XH_SIGNAL_PROBE_H
#define XH_SIGNAL_PROBE_H

/* results keys */
enum xh_signal_result { SENT, FAILED, LAST_ERROR, RESULT_MAX };

#endif
