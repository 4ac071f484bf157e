/* xh_sample: every kept-open file of a Sampler re-read at offset 0 in one call from Python.
 * A fresh read at offset 0 regenerates a seq_file's or kernfs file's content, so the files
 * stay open across samples and the per-file open (path walk, file setup) is paid once. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <liburing.h>
#include "sampler_glue.h"

/* Queue io_uring reads, in file order, until `depth` are in flight or the SQ is full. */
static void sample_fill(struct io_uring *ring, struct xh_sample *s, uint32_t *next,
			uint32_t *inflight)
{
	while (*next < s->n && *inflight < s->depth) {
		uint32_t i = *next;
		struct io_uring_sqe *sqe;

		if (s->slot[i] < 0) {
			(*next)++;
			continue;
		}
		sqe = io_uring_get_sqe(ring);
		if (!sqe)
			return;
		io_uring_prep_read(sqe, s->slot[i], s->base + s->off[i], s->cap[i], 0);
		io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
		io_uring_sqe_set_data64(sqe, i);
		s->res[i] = -ECANCELED;  /* until its completion says otherwise: never last sample's */
		(*next)++;
		(*inflight)++;
		s->uring_reads++;
	}
}

static void sample_reap(struct io_uring *ring, struct xh_sample *s, uint32_t *inflight)
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;

	io_uring_for_each_cqe(ring, head, cqe) {
		s->res[(uint32_t)cqe->user_data] = cqe->res;
		seen++;
	}
	io_uring_cq_advance(ring, seen);
	*inflight -= seen;
}

/* A refused submission (not a transient EINTR/EAGAIN/EBUSY) ends the io_uring side: its
 * files not yet queued report the error, what is in flight is still reaped. */
static int transient(int ret)
{
	return ret == -EINTR || ret == -EAGAIN || ret == -EBUSY;
}

int xh_sample(struct io_uring *ring, struct xh_sample *s)
{
	uint32_t i, next = 0, inflight = 0;
	uint64_t at = 0;
	int err = 0, ret;

	s->failed = s->full = s->nul_files = s->uring_reads = s->pread_reads = 0;
	if (s->depth == 0)
		s->depth = 1;
	/* The io_uring reads go first and are submitted without a wait: most complete inline
	 * during the submission, and any that a worker takes overlap the pread loop below. */
	if (ring) {
		sample_fill(ring, s, &next, &inflight);
		if (inflight && (ret = io_uring_submit(ring)) < 0 && !transient(ret))
			err = ret;
	}
	for (i = 0; i < s->n; i++) {
		ssize_t got;

		if (ring && s->slot[i] >= 0)
			continue;
		if (s->fd[i] < 0) {
			s->res[i] = -EBADF;
			continue;
		}
		do
			got = pread(s->fd[i], s->base + s->off[i], s->cap[i], 0);
		while (got < 0 && errno == EINTR);
		s->res[i] = got < 0 ? -errno : (int32_t)got;
		s->pread_reads++;
	}
	while (ring && inflight) {
		sample_reap(ring, s, &inflight);
		if (!err)
			sample_fill(ring, s, &next, &inflight);
		if (!inflight)
			break;
		ret = io_uring_submit_and_wait(ring, 1);
		if (ret < 0 && !transient(ret)) {
			struct io_uring_cqe *cqe;

			err = err ? err : ret;
			if (io_uring_wait_cqe(ring, &cqe) < 0)
				break; /* nothing comes back any more; the caller closes the ring */
		}
	}
	for (i = next; ring && i < s->n; i++)
		if (s->slot[i] >= 0)
			s->res[i] = err ? err : -ECANCELED;
	/* Pack: pos[i] <= off[i] always (the layout leaves a byte per file for the NUL), so moving
	 * down in order never overwrites bytes not moved yet. */
	for (i = 0; i < s->n; i++) {
		int32_t r = s->res[i];

		s->pos[i] = at;
		if (r < 0) {
			if (s->fd[i] >= 0 || s->slot[i] >= 0)  /* not a skipped file */
				s->failed++;
		} else {
			if ((uint32_t)r == s->cap[i])
				s->full++;
			if (at != s->off[i])
				memmove(s->base + at, s->base + s->off[i], (size_t)r);
			if (memchr(s->base + at, 0, (size_t)r))
				s->nul_files++;
			at += (uint64_t)r;
		}
		s->base[at++] = 0;
	}
	s->pos[s->n] = s->total = at;
	if (err)
		return err;
	return (s->failed ? XH_SAMPLE_FAILED : 0) | (s->full ? XH_SAMPLE_FULL : 0) |
	       (s->nul_files ? XH_SAMPLE_NUL : 0);
}
