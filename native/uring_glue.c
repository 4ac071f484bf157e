/* Per-completion loops kept in C: Python pays one call per batch, not per I/O. */
#include <stdlib.h>
#include <string.h>
#include "uring_glue.h"

void *xh_aligned_alloc(size_t alignment, size_t size)
{
	void *p = NULL;
	if (posix_memalign(&p, alignment, size) != 0)
		return NULL;
	memset(p, 0, size);
	return p;
}

void xh_aligned_free(void *ptr)
{
	free(ptr);
}

/* Copy up to `max` ready completions out of the CQ and release their slots. */
unsigned xh_reap(struct io_uring *ring, uint64_t *user_data, int32_t *res, unsigned max)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;

	io_uring_for_each_cqe(ring, head, cqe) {
		if (n == max)
			break;
		user_data[n] = cqe->user_data;
		res[n] = cqe->res;
		n++;
	}
	io_uring_cq_advance(ring, n);
	return n;
}
