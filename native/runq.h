/* runq.h: the worker pool's run queues in shared memory (xhagent._runq).
 * Plain declarations only: native/runq_build.py hands this file to cffi's cdef as it is.
 *
 * One region (a memfd or a /dev/shm file, mapped MAP_SHARED by every process) holds a
 * local ring per worker, one global ring and a slab of fixed-size payload slots. Rings carry
 * 64-bit entries (slot generation << 32 | slot index), never the payloads themselves.
 *
 * Who may call what: push_local(w) and steal(thief = w) write w's tail, so only w's owner
 * (one thread of one process) calls them. Everything else (pops, push_global, wait, wake)
 * may be called by any thread of any process that mapped the region. */

struct rq;                      /* one process's handle on a mapped region (opaque) */

/* push results */
#define RQ_PUSHED 0
#define RQ_FULL 1               /* the ring has no free cell */
#define RQ_NOSLOT 2             /* every payload slot is in use */
#define RQ_TOOBIG 3             /* the payload is longer than a slot */
/* pop results below 0 (a length otherwise) */
#define RQ_EMPTY -1
#define RQ_CORRUPT -2           /* an entry's generation is not its slot's: a lost or doubled task */
#define RQ_NIL 0xffffffffffffffff  /* no slot (rq_slot_alloc) */

/* NULL on failure, with *err an errno; EPROTO: the file is not a region of ours */
uint64_t rq_region_size(uint32_t workers, uint32_t ring_size, uint32_t slots, uint32_t slot_size);
struct rq *rq_create(int fd, uint32_t workers, uint32_t ring_size, uint32_t slots,
                     uint32_t slot_size, int *err);
struct rq *rq_attach(int fd, int *err);
void rq_close(struct rq *q);
void rq_params(struct rq *q, uint32_t out[4]);  /* workers, ring_size, slots, slot_size */

int rq_push_local(struct rq *q, uint32_t w, const char *data, uint32_t len);
int rq_push_global(struct rq *q, const char *data, uint32_t len);
int64_t rq_pop_local(struct rq *q, uint32_t w, char *out, uint32_t cap);
int64_t rq_pop_global(struct rq *q, char *out, uint32_t cap);
/* Moves up to half (rounded up) of victim's entries to the tail of thief's ring, oldest
 * first, in one CAS; returns how many. Payloads are not copied. */
int64_t rq_steal(struct rq *q, uint32_t thief, uint32_t victim);

/* 1: work is visible or a wake came; 0: timed out or a signal arrived. timeout_ns < 0: none.
 * A wake that finds w awake is kept: w's next wait returns 1 at once. */
int rq_wait(struct rq *q, uint32_t w, int64_t timeout_ns);
void rq_wake(struct rq *q, uint32_t w);
uint32_t rq_sleepers(struct rq *q);     /* workers in rq_wait now (an idle count) */

uint64_t rq_local_len(struct rq *q, uint32_t w);
uint64_t rq_global_len(struct rq *q);
uint64_t rq_free_count(struct rq *q);   /* walks the free list: exact only when quiescent */

/* The steps that rq_steal and the slot allocator loop over, exported so that a test can
 * interleave other operations between a thief's (or allocator's) read and its CAS. */
int64_t rq_steal_begin(struct rq *q, uint32_t thief, uint32_t victim, uint64_t *head);
int64_t rq_steal_commit(struct rq *q, uint32_t thief, uint32_t victim, uint64_t head, uint64_t n);
int64_t rq_alloc_begin(struct rq *q, uint64_t *head, uint32_t *next);
int rq_alloc_commit(struct rq *q, uint64_t head, uint32_t next);
uint64_t rq_slot_alloc(struct rq *q);            /* an entry, or RQ_NIL */
void rq_slot_free(struct rq *q, uint64_t entry);
uint64_t rq_local_entry(struct rq *q, uint32_t w, uint64_t pos);  /* the raw cell pos % ring_size */

/* The pool's preemption fallback where BPF is not available: a timer on the calling
 * thread's CPU-time clock (CLOCK_THREAD_CPUTIME_ID) that sends `signo` to that thread
 * (SIGEV_THREAD_ID). Ids are the kernel's; every call returns a negative errno on failure. */
int rq_cputimer_create(int signo);                 /* a disarmed timer's id */
int rq_cputimer_set(int id, int64_t first_ns, int64_t interval_ns);  /* 0, 0: disarm */
int rq_cputimer_get(int id, int64_t out[2]);       /* CPU time left to the next expiry, interval */
int rq_cputimer_delete(int id);

/* rq_wait in two halves, for a worker that sleeps elsewhere (an io_uring FUTEX_WAIT on the
 * same word, beside its tasks' I/O). begin: 1 when there is no sleeping to do (work is
 * visible or a wake came); 0 once announced as a sleeper, with the futex word's address and
 * the value to wait on in *word and *seq. end: after the sleep, whatever ended it. */
int rq_wait_begin(struct rq *q, uint32_t w, uint64_t *word, uint32_t *seq);
void rq_wait_end(struct rq *q, uint32_t w);
