/* uring_glue.h: the loops of xhagent._uring that run once per I/O (uring_glue.c).
 * Plain declarations only: native/uring_build.py hands this file to cffi's cdef as it is,
 * after its own liburing declarations, so no includes or guards here (include <stddef.h>,
 * <stdint.h> and <liburing.h> first). */

void *xh_aligned_alloc(size_t alignment, size_t size);
void xh_aligned_free(void *ptr);
int64_t xh_first_misaligned(const uint64_t *offsets, uint64_t n, uint64_t block);
unsigned xh_reap(struct io_uring *ring, uint64_t *user_data, int32_t *res, unsigned max);

#define XH_OP_READ 0
#define XH_OP_WRITE 1

/* One batch of reads or writes; op i uses fds[i] (or fd), offsets[i], lens[i] (or len),
 * and the buffer bufs[i] (or base + i * stride). */
struct xh_batch {
	uint32_t n;
	uint32_t depth;        /* most ops in flight; <= the ring's SQ entries */
	uint8_t opcode;        /* XH_OP_READ, XH_OP_WRITE */
	uint8_t retry_short;   /* resubmit the rest of a short transfer (0: report it) */
	uint8_t fixed_file;    /* fds are registered-file indexes */
	int32_t buf_index;     /* registered buffer holding every buffer, or -1 */
	int32_t fd;
	const int32_t *fds;
	const uint64_t *offsets;
	uint32_t len;
	const uint32_t *lens;
	char *base;
	uint64_t stride;
	char *const *bufs;
	int64_t *res;          /* out: bytes transferred, or -errno */
	uint32_t *lat_ns;      /* out, optional: first submission to completion */
	/* kept by the loop */
	uint32_t next;         /* ops prepared so far */
	uint32_t left;         /* ops whose last completion is not reaped yet */
	uint64_t *start;       /* per-op first submission time, while lat_ns is asked for */
};
int xh_rw_batch(struct io_uring *ring, struct xh_batch *b);

/* A stream of batches through one loop: up to `depth` ops stay in flight across
 * successive batches, so a long run drains only when it ends. xh_rw_batch is a stream of
 * one batch, drained. */
#define XH_STREAM_LIVE 4
struct xh_stream {
	uint32_t depth;
	uint32_t submit_batch; /* submit every this many prepared ops (0: all at once, at the wait) */
	uint32_t inflight;     /* prepared ops whose last completion is not reaped yet */
	uint32_t min_inflight; /* fewest in flight at a wait before the final drain (UINT32_MAX: none yet) */
	uint64_t waits;        /* waits for completions */
	uint64_t ops;          /* ops completed */
	uint64_t head, tail;   /* batch sequence numbers: live[head % LIVE] is the oldest unfinished */
	struct xh_batch *live[XH_STREAM_LIVE];
	int32_t err;           /* io_uring_enter refusal: no more ops are prepared */
	/* sink streams: op buffers are `nslots` slots of base (slot k at base + k * stride), one
	 * per op in flight, reused as ops complete; the data is not kept per op */
	uint32_t nslots;
	uint32_t nfree;
	uint32_t *free_slots;
};
void xh_stream_init(struct xh_stream *s, uint32_t depth);
/* Make `s` a sink stream of `nslots` (depth..65535) slots; free_slots: nslots entries that
 * outlive the stream. -EINVAL otherwise. */
int xh_stream_sink(struct xh_stream *s, uint32_t nslots, uint32_t *free_slots);
/* Add `b` (NULL: none) and run. drain = 0: return once every batch but the newest is
 * complete, with the queue refilled and submitted; drain = 1: return when nothing is in
 * flight. Returns 0, -EBUSY when XH_STREAM_LIVE batches are already live, -ENOMEM, or the
 * negative errno of io_uring_enter once what was in flight is back. */
int xh_stream_run(struct io_uring *ring, struct xh_stream *s, struct xh_batch *b, int drain);

/* openat -> read -> close chains through registered-file slots, `slots` in flight.
 * `paths` holds npaths NUL-terminated paths back to back; file k of this call is
 * paths[index[k]] (index NULL: paths[k]) and reads up to `len` bytes into base + k * len. */
struct xh_files {
	uint32_t n;
	uint32_t slots;
	uint32_t slot_base;
	const char *paths;
	uint32_t npaths;
	const uint32_t *index;
	const uint8_t *sync;   /* per path, or NULL: 1 = read with open/read/close system calls */
	char *base;
	uint32_t len;
	int32_t *res;          /* out: bytes read, or -errno of the open or of the read */
};
int xh_read_files(struct io_uring *ring, struct xh_files *f);

/* Single preparations for callers that submit on their own schedule (asyncio). */
int xh_prep_rw(struct io_uring *ring, int opcode, int fd, void *buf, unsigned len, uint64_t offset,
	       uint64_t user_data, unsigned sqe_flags);
int xh_prep_file_chain(struct io_uring *ring, const char *path, unsigned slot, void *buf, unsigned len,
		       uint64_t user_data_base);

/* The runtime's task ring (xhagent.runtime.io): one io_uring enter per scheduler round.
 * Submit what is queued and, when wait_ns != 0 and no completion is ready, wait for one
 * (wait_ns < 0: without a limit), in one io_uring_enter; then copy up to `max` ready
 * completions to out as (user_data, res) pairs and release their CQ slots. Returns how
 * many, or the negative errno of a refused enter (an interrupted or timed-out wait is not
 * one). */
int xh_rt_enter(struct io_uring *ring, int64_t wait_ns, int64_t *out, unsigned max);
/* One request tried inline: queued and submitted in one io_uring_enter (as xh_rt_prep then
 * xh_rt_enter with wait_ns 0, in one call). When its completion is ready after the enter,
 * its result goes to *res; other ready completions go to out as in xh_rt_enter. *res is
 * INT64_MIN when it did not complete (it stays in flight under user_data). Returns how many
 * others, or the negative errno of a refused enter (-EBUSY: the SQ is full, nothing queued). */
int xh_rt_now(struct io_uring *ring, int opcode, int fd, char *buf, uint64_t buf_off, unsigned len,
	      uint64_t offset, uint64_t user_data, int64_t *res, int64_t *out, unsigned max);
/* The floor of a task's inline read, for the bench: n reads of `len` bytes at offs[i] into
 * dst + i * len, each queued, submitted and reaped alone as xh_rt_now does (a read that
 * does not complete inside its enter is waited for). Returns the bytes read in all, or the
 * first negative errno. The ring must have nothing else in flight. */
int64_t xh_rt_each(struct io_uring *ring, int fd, char *dst, const uint64_t *offs, unsigned n,
		   unsigned len);
/* Arm a one-shot POLLIN on `fd` (an eventfd that other threads write to wake the ring's
 * sleeper); its completion carries user_data. -EBUSY when the SQ is full. */
int xh_rt_poll(struct io_uring *ring, int fd, uint64_t user_data);
/* Queue one read or write of `len` bytes at buf + buf_off (a char * so that Python may pass
 * bytes as they are). -EBUSY when the SQ is full. */
int xh_rt_prep(struct io_uring *ring, int opcode, int fd, char *buf, uint64_t buf_off, unsigned len,
	       uint64_t offset, uint64_t user_data);
/* Arm an IORING_OP_FUTEX_WAIT (Linux 6.7) on the shared (not process-private) 32-bit futex
 * word at `addr`, expected to hold `val`: a FUTEX_WAKE on it from any process completes
 * it (user_data), so a sleep on the ring also ends when a pool worker is handed work.
 * -EBUSY when the SQ is full. xh_rt_futex_supported: whether this kernel has the op. */
int xh_rt_futex_wait(struct io_uring *ring, uint64_t addr, uint32_t val, uint64_t user_data);
int xh_rt_futex_supported(struct io_uring *ring);
