/* SPDX-License-Identifier: GPL-2.0 */
/* Map helpers shared by every ebpf/<program>.bpf.c (include after vmlinux.h and
 * bpf/bpf_helpers.h), and XH_BTF_EXPORT for the types user space reads. */
#ifndef XH_MAPS_BPF_H
#define XH_MAPS_BPF_H

/* Map declarations: every program declares the same few kinds of map, and the
 * loaders (agent/bpf/) find them by name, so one spelling of each keeps the
 * key/value types and sizes from drifting between programs. */

/* A map of `n` entries, `key_t` -> `value_t`. */
#define XH_MAP(name, map_type, n, key_t, value_t) \
	struct { \
		__uint(type, map_type); \
		__uint(max_entries, n); \
		__type(key, key_t); \
		__type(value, value_t); \
	} name SEC(".maps")

/* An array of `n` `value_t` indexed by a __u32: configuration, shared counters. */
#define XH_ARRAY(name, n, value_t) XH_MAP(name, BPF_MAP_TYPE_ARRAY, n, __u32, value_t)

/* One value user space sets while the program is attached (.rodata cannot change). */
#define XH_SCALAR_ARRAY(name, value_t) XH_ARRAY(name, 1, value_t)

/* `n` __u64 counters per CPU (xh_bump: no atomics); user space sums the CPUs. */
#define XH_PERCPU_COUNTERS(name, n) \
	XH_MAP(name, BPF_MAP_TYPE_PERCPU_ARRAY, n, __u32, __u64)

/* A ring buffer of `bytes` (a power of two, a multiple of the page size). */
#define XH_RINGBUF(name, bytes) \
	struct { \
		__uint(type, BPF_MAP_TYPE_RINGBUF); \
		__uint(max_entries, bytes); \
	} name SEC(".maps")

/* Slot `idx` of an array map of __u64 counters, or NULL past its end. */
static __always_inline __u64 *xh_slot(void *map, __u32 idx)
{
	return bpf_map_lookup_elem(map, &idx);
}

/* Value of slot `idx` (0 past the end): configuration arrays. */
static __always_inline __u64 xh_get(void *map, __u32 idx)
{
	__u64 *v = xh_slot(map, idx);

	return v ? *v : 0;
}

/* +1 in a BPF_MAP_TYPE_PERCPU_ARRAY: this CPU's slot, so no atomics needed. */
static __always_inline void xh_bump(void *map, __u32 idx)
{
	__u64 *v = xh_slot(map, idx);

	if (v)
		*v += 1;
}

/* +n in a shared BPF_MAP_TYPE_ARRAY: atomic, any CPU may be adding. */
static __always_inline void xh_add(void *map, __u32 idx, __u64 n)
{
	__u64 *v = xh_slot(map, idx);

	if (v)
		__sync_fetch_and_add(v, n);
}

/* Overwrite slot `idx` (last-value slots such as a last error). */
static __always_inline void xh_set(void *map, __u32 idx, __u64 n)
{
	__u64 *v = xh_slot(map, idx);

	if (v)
		*v = n;
}

/* Put `type` (a struct or an enum of the program's header) into the object's BTF.
 * Records written only through ring-buffer pointers and enums used only as constants
 * do not reach BTF otherwise, and tests/unit/test_bpf_layout.py checks the Python
 * layouts against that BTF. The pointer lives in a section libbpf skips, so it
 * creates no map and is never loaded; only its BTF goes to the kernel. */
#define XH_BTF_EXPORT(type, tag) \
	type *__xh_btf_##tag SEC(".xh_btf") __attribute__((used))

#endif
