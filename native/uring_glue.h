#ifndef XH_URING_GLUE_H
#define XH_URING_GLUE_H
#include <stddef.h>
#include <stdint.h>
#include <liburing.h>

void *xh_aligned_alloc(size_t alignment, size_t size);
void xh_aligned_free(void *ptr);
unsigned xh_reap(struct io_uring *ring, uint64_t *user_data, int32_t *res, unsigned max);

#endif
