/* Per-completion loops kept in C: Python pays one call per batch, not per I/O. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <liburing.h>
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

/* Index of the first offset that is not a multiple of `block`, or -1: checked once per batch
 * of O_DIRECT ops, cheaply. */
int64_t xh_first_misaligned(const uint64_t *offsets, uint64_t n, uint64_t block)
{
	uint64_t i;

	for (i = 0; i < n; i++)
		if (offsets[i] % block)
			return (int64_t)i;
	return -1;
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


#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>
#include <time.h>

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

/* An SQE, pushing queued ones to the kernel while the SQ is full (an SQPOLL thread may lag). */
static struct io_uring_sqe *get_sqe(struct io_uring *ring)
{
	struct io_uring_sqe *sqe;

	while ((sqe = io_uring_get_sqe(ring)) == NULL) {
		if (io_uring_submit(ring) < 0)
			sched_yield();
	}
	return sqe;
}

static void prep_rw(struct io_uring_sqe *sqe, int opcode, int fd, char *buf, unsigned len,
		    uint64_t off, int buf_index)
{
	if (opcode == XH_OP_WRITE) {
		if (buf_index >= 0)
			io_uring_prep_write_fixed(sqe, fd, buf, len, off, buf_index);
		else
			io_uring_prep_write(sqe, fd, buf, len, off);
	} else {
		if (buf_index >= 0)
			io_uring_prep_read_fixed(sqe, fd, buf, len, off, buf_index);
		else
			io_uring_prep_read(sqe, fd, buf, len, off);
	}
}

/* user_data of a stream op: live-batch tag, buffer slot (sink streams), op index. */
#define UD(tag, slot, i) ((uint64_t)(tag) << 48 | (uint64_t)(slot) << 32 | (i))
#define UD_TAG(ud) ((ud) >> 48)
#define UD_SLOT(ud) ((uint32_t)((ud) >> 32) & 0xFFFF)

static void batch_prep(struct io_uring *ring, struct xh_stream *s, struct xh_batch *b, uint32_t i,
		       uint64_t ud)
{
	struct io_uring_sqe *sqe = get_sqe(ring);
	uint64_t done = (uint64_t)b->res[i];
	unsigned len = b->lens ? b->lens[i] : b->len;
	char *buf = s->nslots ? b->base + (uint64_t)UD_SLOT(ud) * b->stride
		  : b->bufs ? b->bufs[i] : b->base + (uint64_t)i * b->stride;

	prep_rw(sqe, b->opcode, b->fds ? b->fds[i] : b->fd, buf + done, len - done,
		b->offsets[i] + done, b->buf_index);
	if (b->fixed_file)
		io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
	io_uring_sqe_set_data64(sqe, ud);
}

/* Submit what is queued and wait for a completion. A refusal stops the feeding (*err) but
 * not the reaping: what is in flight still comes back before the caller returns. -1 when
 * even waiting fails. */
static int submit_and_wait_one(struct io_uring *ring, int *err)
{
	struct io_uring_cqe *cqe;
	int ret = io_uring_submit_and_wait(ring, 1);

	if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
		*err = ret;
		if (io_uring_wait_cqe(ring, &cqe) < 0)
			return -1;
	}
	return 0;
}

/* -- the read/write loop: a stream of batches; a plain batch is a stream of one ------------ */

void xh_stream_init(struct xh_stream *s, uint32_t depth)
{
	memset(s, 0, sizeof(*s));
	s->depth = depth ? depth : 1;
	s->min_inflight = UINT32_MAX;
}

int xh_stream_sink(struct xh_stream *s, uint32_t nslots, uint32_t *free_slots)
{
	uint32_t i;

	if (nslots < s->depth || nslots > 0xFFFF || s->inflight)
		return -EINVAL;
	for (i = 0; i < nslots; i++)
		free_slots[i] = nslots - 1 - i;
	s->free_slots = free_slots;
	s->nslots = s->nfree = nslots;
	return 0;
}

static struct xh_batch *live_batch(struct xh_stream *s, uint64_t seq)
{
	return s->live[seq % XH_STREAM_LIVE];
}

static int stream_push(struct xh_stream *s, struct xh_batch *b)
{
	uint32_t i;

	if (s->tail - s->head == XH_STREAM_LIVE)
		return -EBUSY;
	b->start = NULL;
	if (b->lat_ns) {
		b->start = malloc(sizeof(*b->start) * (b->n ? b->n : 1));
		if (!b->start)
			return -ENOMEM;
	}
	for (i = 0; i < b->n; i++)
		b->res[i] = 0;
	b->next = 0;
	b->left = b->n;
	s->live[s->tail++ % XH_STREAM_LIVE] = b;
	return 0;
}

/* The oldest live batch with ops not prepared yet (its sequence number in *seq), or NULL. */
static struct xh_batch *to_prepare(struct xh_stream *s, uint64_t *seq)
{
	uint64_t q;

	for (q = s->head; q < s->tail; q++) {
		struct xh_batch *b = live_batch(s, q);

		if (b->next < b->n) {
			*seq = q;
			return b;
		}
	}
	return NULL;
}

/* Prepare ops, oldest batch first, until `depth` are in flight or none is left. */
static void stream_fill(struct io_uring *ring, struct xh_stream *s)
{
	struct xh_batch *b;
	uint64_t seq;

	while (!s->err && s->inflight < s->depth && (b = to_prepare(s, &seq)) != NULL) {
		while (s->inflight < s->depth && b->next < b->n) {
			uint32_t i = b->next++;

			uint32_t slot = s->nslots ? s->free_slots[--s->nfree] : 0;

			if (b->start)
				b->start[i] = now_ns();
			batch_prep(ring, s, b, i, UD(seq % XH_STREAM_LIVE, slot, i));
			s->inflight++;
			/* As fio's commit: the enter also runs completions that are due (GETEVENTS). */
			if (s->submit_batch && io_uring_sq_ready(ring) >= s->submit_batch)
				io_uring_submit_and_get_events(ring);
		}
	}
}

/* Reap every ready completion, resubmit short transfers when asked. */
static void stream_reap(struct io_uring *ring, struct xh_stream *s)
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;

	io_uring_for_each_cqe(ring, head, cqe) {
		struct xh_batch *b = s->live[UD_TAG(cqe->user_data)];
		uint32_t k = (uint32_t)cqe->user_data;
		unsigned len = b->lens ? b->lens[k] : b->len;

		seen++;
		if (cqe->res < 0) {
			b->res[k] = cqe->res;
		} else {
			b->res[k] += cqe->res;
			if (cqe->res > 0 && b->retry_short && (uint64_t)b->res[k] < len && !s->err) {
				batch_prep(ring, s, b, k, cqe->user_data);
				continue;
			}
		}
		if (s->nslots)
			s->free_slots[s->nfree++] = UD_SLOT(cqe->user_data);
		s->inflight--;
		s->ops++;
		b->left--;
		if (b->start) {
			uint64_t d = now_ns() - b->start[k];
			b->lat_ns[k] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
		}
	}
	io_uring_cq_advance(ring, seen);
}

/* Forget the finished batches at the front (an empty batch is finished when it is fed). */
static void stream_retire(struct xh_stream *s)
{
	while (s->head < s->tail && live_batch(s, s->head)->left == 0) {
		struct xh_batch *b = live_batch(s, s->head++);

		free(b->start);
		b->start = NULL;
	}
}

int xh_stream_run(struct io_uring *ring, struct xh_stream *s, struct xh_batch *b, int drain)
{
	uint64_t seq;
	int ret;

	if (b && (ret = stream_push(s, b)) < 0)
		return ret;
	for (;;) {
		int feeding;

		stream_fill(ring, s);
		stream_retire(s);
		feeding = !s->err && to_prepare(s, &seq) != NULL;
		if (drain || s->err ? s->inflight == 0 && !feeding : s->tail - s->head <= 1)
			break;
		if ((feeding || !drain) && s->inflight < s->min_inflight)
			s->min_inflight = s->inflight;
		s->waits++;
		if (submit_and_wait_one(ring, &s->err) < 0)
			break;
		stream_reap(ring, s);
	}
	/* What was refilled goes to the kernel now, not at the next call. */
	if (io_uring_sq_ready(ring) && (ret = io_uring_submit(ring)) < 0 && !s->err &&
	    ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
		s->err = ret;
	return s->err;
}

int xh_rw_batch(struct io_uring *ring, struct xh_batch *b)
{
	struct xh_stream s;

	xh_stream_init(&s, b->depth);
	return xh_stream_run(ring, &s, b, 1);
}

int xh_prep_rw(struct io_uring *ring, int opcode, int fd, void *buf, unsigned len, uint64_t offset,
	       uint64_t user_data, unsigned sqe_flags)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe)
		return -EBUSY;
	prep_rw(sqe, opcode, fd, buf, len, offset, -1);
	io_uring_sqe_set_flags(sqe, sqe_flags);
	io_uring_sqe_set_data64(sqe, user_data);
	return 0;
}

/* openat(slot) -LINK-> read(slot) -HARDLINK-> close(slot); user_data base|1, |2, |3.
 * A short read fails a plain link, so the close hangs on a hard link: the slot is
 * always released, and a failed open cancels the read and the close. */
int xh_prep_file_chain(struct io_uring *ring, const char *path, unsigned slot, void *buf, unsigned len,
		       uint64_t user_data_base)
{
	struct io_uring_sqe *sqe;

	if (io_uring_sq_space_left(ring) < 3)
		return -EBUSY;
	sqe = io_uring_get_sqe(ring);
	/* O_CLOEXEC is refused (EINVAL) for a fixed slot: such a file has no fd to inherit. */
	io_uring_prep_openat_direct(sqe, AT_FDCWD, path, O_RDONLY, 0, slot);
	io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK);
	io_uring_sqe_set_data64(sqe, user_data_base | 1);
	sqe = io_uring_get_sqe(ring);
	io_uring_prep_read(sqe, slot, buf, len, 0);
	io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE | IOSQE_IO_HARDLINK);
	io_uring_sqe_set_data64(sqe, user_data_base | 2);
	sqe = io_uring_get_sqe(ring);
	io_uring_prep_close_direct(sqe, slot);
	io_uring_sqe_set_data64(sqe, user_data_base | 3);
	return 0;
}

/* Where each of the `count` NUL-separated paths in `blob` starts. */
static const char **split_paths(const char *blob, uint32_t count)
{
	const char **at = malloc(sizeof(*at) * (count ? count : 1));
	uint32_t i;

	if (!at)
		return NULL;
	for (i = 0; i < count; i++) {
		at[i] = blob;
		blob += strlen(blob) + 1;
	}
	return at;
}

static void file_result(struct xh_files *f, uint32_t k, int open_res, int read_res)
{
	f->res[k] = open_res < 0 ? open_res : read_res;
}

static void read_with_syscalls(struct xh_files *f, uint32_t k, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : read(fd, f->base + (uint64_t)k * f->len, f->len);

	file_result(f, k, fd < 0 ? -errno : 0, n < 0 ? -errno : (int32_t)n);
	if (fd >= 0)
		close(fd);
}

int xh_read_files(struct io_uring *ring, struct xh_files *f)
{
	const char **path = split_paths(f->paths, f->npaths);
	uint32_t *free_slots = malloc(sizeof(*free_slots) * (f->slots ? f->slots : 1));
	uint32_t *slot_of = malloc(sizeof(*slot_of) * (f->n ? f->n : 1));
	int32_t *open_res = malloc(sizeof(*open_res) * (f->n ? f->n : 1));
	uint8_t *left = malloc(f->n ? f->n : 1);
	uint32_t nfree = f->slots, next = 0, inflight = 0, i;
	int err = f->slots ? 0 : -EINVAL;

	if (!path || !free_slots || !slot_of || !open_res || !left)
		err = -ENOMEM;
	for (i = 0; !err && i < f->slots; i++)
		free_slots[i] = f->slot_base + f->slots - 1 - i;
	while ((next < f->n && !err) || inflight) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;

		while (!err && next < f->n && nfree && io_uring_sq_space_left(ring) >= 3) {
			uint32_t which = f->index ? f->index[next] : next;
			uint32_t slot;

			if (f->sync && f->sync[which]) {
				read_with_syscalls(f, next++, path[which]);
				continue;
			}
			slot = free_slots[--nfree];
			slot_of[next] = slot;
			left[next] = 3;
			open_res[next] = f->res[next] = -ECANCELED;
			xh_prep_file_chain(ring, path[which], slot, f->base + (uint64_t)next * f->len, f->len,
					   (uint64_t)next << 2);
			next++;
			inflight++;
		}
		if (!inflight)
			continue;  /* every file so far was read with system calls */
		if (submit_and_wait_one(ring, &err) < 0)
			break;
		io_uring_for_each_cqe(ring, head, cqe) {
			uint32_t k = (uint32_t)(cqe->user_data >> 2);

			seen++;
			if ((cqe->user_data & 3) == 1)
				open_res[k] = cqe->res;
			else if ((cqe->user_data & 3) == 2)
				file_result(f, k, open_res[k], cqe->res);
			/* the close's result is not the caller's business: the file was only read */
			if (--left[k] == 0) {
				free_slots[nfree++] = slot_of[k];
				inflight--;
			}
		}
		io_uring_cq_advance(ring, seen);
	}
	free(path), free(free_slots), free(slot_of), free(open_res), free(left);
	return err;
}

/* -- the runtime's task ring --------------------------------------------------------------- */
#include <poll.h>

int xh_rt_enter(struct io_uring *ring, int64_t wait_ns, int64_t *out, unsigned max)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	int ret = 0;

	if (wait_ns != 0 && !io_uring_cq_ready(ring)) {
		struct __kernel_timespec ts = {wait_ns / 1000000000, wait_ns % 1000000000};

		/* submit and wait in the same enter: a page-cache read completes inside it */
		ret = io_uring_submit_and_wait_timeout(ring, &cqe, 1, wait_ns < 0 ? NULL : &ts, NULL);
	} else if (io_uring_sq_ready(ring)) {
		ret = io_uring_submit(ring);
	}
	if (ret == -ETIME || ret == -EINTR || ret == -EAGAIN || ret == -EBUSY)
		ret = 0;
	io_uring_for_each_cqe(ring, head, cqe) {
		if (n == max)
			break;
		out[2 * n] = (int64_t)cqe->user_data;
		out[2 * n + 1] = cqe->res;
		n++;
	}
	io_uring_cq_advance(ring, n);
	return ret < 0 && n == 0 ? ret : (int)n;
}

int xh_rt_now(struct io_uring *ring, int opcode, int fd, char *buf, uint64_t buf_off, unsigned len,
	      uint64_t offset, uint64_t user_data, int64_t *res, int64_t *out, unsigned max)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	struct io_uring_cqe *cqe;
	unsigned head, n = 0, seen = 0;
	int ret;

	*res = INT64_MIN;
	if (!sqe)
		return -EBUSY;
	prep_rw(sqe, opcode, fd, buf + buf_off, len, offset, -1);
	io_uring_sqe_set_data64(sqe, user_data);
	/* no GETEVENTS: a read the page cache answers completes inside the submit itself */
	ret = io_uring_submit(ring);
	if (ret == -EINTR || ret == -EAGAIN || ret == -EBUSY)
		ret = 0;
	io_uring_for_each_cqe(ring, head, cqe) {
		if (cqe->user_data == user_data && *res == INT64_MIN) {
			*res = cqe->res;
		} else {
			if (n == max)
				break;
			out[2 * n] = (int64_t)cqe->user_data;
			out[2 * n + 1] = cqe->res;
			n++;
		}
		seen++;
	}
	io_uring_cq_advance(ring, seen);
	return ret < 0 && n == 0 && *res == INT64_MIN ? ret : (int)n;
}

int64_t xh_rt_each(struct io_uring *ring, int fd, char *dst, const uint64_t *offs, unsigned n,
		   unsigned len)
{
	int64_t total = 0, res;
	struct io_uring_cqe *cqe;
	int ret;

	for (unsigned i = 0; i < n; i++) {
		ret = xh_rt_now(ring, XH_OP_READ, fd, dst, (uint64_t)i * len, len, offs[i], i, &res,
				NULL, 0);
		if (ret < 0)
			return ret;
		if (res == INT64_MIN) {  /* not answered inside the enter: wait for it */
			ret = io_uring_wait_cqe(ring, &cqe);
			if (ret < 0)
				return ret;
			res = cqe->res;
			io_uring_cqe_seen(ring, cqe);
		}
		if (res < 0)
			return res;
		total += res;
	}
	return total;
}

int xh_rt_poll(struct io_uring *ring, int fd, uint64_t user_data)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_add(sqe, fd, POLLIN);
	io_uring_sqe_set_data64(sqe, user_data);
	return 0;
}

int xh_rt_prep(struct io_uring *ring, int opcode, int fd, char *buf, uint64_t buf_off, unsigned len,
	       uint64_t offset, uint64_t user_data)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe)
		return -EBUSY;
	prep_rw(sqe, opcode, fd, buf + buf_off, len, offset, -1);
	io_uring_sqe_set_data64(sqe, user_data);
	return 0;
}

/* Not in liburing 2.3's headers: the kernel's values (include/uapi/linux/io_uring.h, futex.h). */
#define XH_IORING_OP_FUTEX_WAIT 51
#define XH_FUTEX2_SIZE_U32 0x02
#define XH_FUTEX_BITSET_MATCH_ANY 0xffffffffu

int xh_rt_futex_wait(struct io_uring *ring, uint64_t addr, uint32_t val, uint64_t user_data)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe)
		return -EBUSY;
	/* as liburing 2.5's io_uring_prep_futex_wait: fd = futex2 flags, off = the value */
	io_uring_prep_rw(XH_IORING_OP_FUTEX_WAIT, sqe, XH_FUTEX2_SIZE_U32, (void *)(uintptr_t)addr, 0,
			 val);
	sqe->addr3 = XH_FUTEX_BITSET_MATCH_ANY;
	io_uring_sqe_set_data64(sqe, user_data);
	return 0;
}

int xh_rt_futex_supported(struct io_uring *ring)
{
	struct io_uring_probe *probe = io_uring_get_probe_ring(ring);
	int ok;

	if (!probe)
		return 0;
	ok = probe->last_op >= XH_IORING_OP_FUTEX_WAIT &&
	     io_uring_opcode_supported(probe, XH_IORING_OP_FUTEX_WAIT);
	io_uring_free_probe(probe);
	return ok;
}
