/* sampler_glue.h: the one call behind xhagent.io.Sampler (sampler_glue.c).
 * Plain declarations only, like uring_glue.h: native/uring_build.py hands this file to cffi's
 * cdef as it is, so no includes or guards here. */

/* Re-read `n` kept-open files at offset 0, in one call.
 * File i reads up to cap[i] bytes into base + off[i]: through io_uring from registered-file
 * slot[i] when slot[i] >= 0 (files io_uring reads inline), else with pread(fd[i]) (files whose
 * reads io_uring would hand to an io-wq worker); fd[i] < 0 and slot[i] < 0: not read
 * (res[i] = -EBADF). ring may be NULL: every file is read with pread.
 * Once all are read, their bytes are moved together in order, from base, each followed by a
 * NUL byte: file i's res[i] bytes start at pos[i] (res[i] < 0: -errno, nothing kept but the
 * NUL), and pos[i + 1] == pos[i] + max(res[i], 0) + 1 (pos has n + 1 entries). When no file
 * holds a NUL byte itself (nul_files == 0), the packed bytes split at NUL into the files, in
 * one pass. The layout needs off[i + 1] >= off[i] + cap[i] + 1, so packing never overtakes. */
struct xh_sample {
	uint32_t n;
	uint32_t depth;        /* io_uring reads in flight at most (<= the ring's CQ entries) */
	const int32_t *fd;
	const int32_t *slot;
	char *base;
	const uint64_t *off;
	const uint32_t *cap;
	int32_t *res;          /* out */
	uint64_t *pos;         /* out, n + 1 entries */
	uint64_t total;        /* out: bytes packed, from base (NULs included) */
	uint32_t failed;       /* out: files read with res < 0, skipped ones not counted */
	uint32_t full;         /* out: files that filled their buffer (res == cap: maybe longer) */
	uint32_t nul_files;    /* out: files whose bytes hold a NUL byte */
	uint32_t uring_reads;  /* out */
	uint32_t pread_reads;  /* out */
};
/* Returns a negative errno when io_uring refused (the files it left report it), else the
 * XH_SAMPLE_* flags of what needs a look: any file failed, filled its buffer, holds a NUL. */
#define XH_SAMPLE_FAILED 1
#define XH_SAMPLE_FULL 2
#define XH_SAMPLE_NUL 4
int xh_sample(struct io_uring *ring, struct xh_sample *s);
