/* runq.c: the worker pool's run queues in one shared-memory region (see runq.h).
 *
 * Local ring (one per worker): the bounded ring of Go's runtime (runqput/runqget/runqgrab).
 * Only the owner writes `tail`; consumers, the owner's pops and thieves alike, take from
 * `head` with a CAS. A thief copies up to half of the victim's entries into its own ring,
 * past its tail where nobody reads, and one CAS on the victim's head commits the whole
 * batch; a failed CAS discards the copies. The owner's pops are FIFO, as Go's are: a task
 * queued first runs first, and a thief takes the oldest ones.
 *
 * Global ring: Vyukov's bounded MPMC queue; each cell's sequence number says whose turn
 * the cell is (a producer's on lap k, a consumer's after it), so any process may push or pop.
 *
 * ABA. head, tail, enq and deq are 64-bit counters that only grow (they never wrap in
 * practice), so "the head is still h" means nothing moved since it was read: a CAS cannot
 * succeed on a head that went round the ring and came back to the same cell, even when that
 * cell names the same slot again. The free list of slots is a Treiber stack whose head
 * carries a 40-bit tag beside a 24-bit index, bumped by every push and pop. Entries carry
 * their slot's generation (bumped when the slot is freed); a consumer that finds another
 * generation in the slot reports RQ_CORRUPT instead of running a task twice.
 *
 * Sleeping: a worker announces itself (sleeping flag, sleepers count), looks once more for
 * work, then FUTEX_WAITs on its own word; a producer publishes its entry, then looks for an
 * announced sleeper. Both sides put a seq_cst fence between their store and their load
 * (Dekker), so either the sleeper sees the entry or the producer sees the sleeper. The futex
 * word is a wake counter read before announcing, so a wake between the check and the
 * FUTEX_WAIT makes the wait return at once. No FUTEX_PRIVATE_FLAG: other processes share it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "runq.h"

#define CL 64
#define MAGIC 0x78687275710a0001ull   /* "xhruq" and a byte of layout version */
#define VERSION 1u
#define IDX_BITS 24
#define IDX_MASK ((1ull << IDX_BITS) - 1)
#define IDX_NIL ((uint32_t)IDX_MASK)
#define SPINS 64                      /* looks for work before sleeping: a few microseconds */
#define RLX memory_order_relaxed
#define ACQ memory_order_acquire
#define REL memory_order_release
#define SC memory_order_seq_cst

struct header {
    _Atomic uint64_t magic;           /* stored last by rq_create: attach sees a whole region */
    uint32_t version, workers, ring_size, slots, slot_size, pad;
    uint64_t size;
    alignas(CL) _Atomic uint64_t free_head;   /* tag << IDX_BITS | index */
    alignas(CL) _Atomic uint32_t sleepers;    /* announced sleepers: producers skip the scan at 0 */
};

struct local {                        /* followed by ring_size cells */
    alignas(CL) _Atomic uint64_t head;
    alignas(CL) _Atomic uint64_t tail;
    alignas(CL) _Atomic uint32_t futex;
    _Atomic uint32_t sleeping;
    _Atomic uint32_t woken;           /* rq_wake's request, kept until a wait returns on it */
    alignas(CL) _Atomic uint64_t cell[];
};

struct gcell {
    _Atomic uint64_t seq;
    _Atomic uint64_t entry;
};

struct global {
    alignas(CL) _Atomic uint64_t enq;
    alignas(CL) _Atomic uint64_t deq;
    alignas(CL) struct gcell cell[];
};

struct meta {
    _Atomic uint32_t next;            /* free-list link */
    _Atomic uint32_t gen;
    uint32_t len;                     /* ordered by the ring's release/acquire: plain */
    uint32_t pad;
};

struct rq {                           /* per process: the region's address differs in each */
    char *base;
    uint64_t size, stride, mask;
    uint32_t workers, slots, slot_size;
    struct header *h;
    struct global *g;
    struct meta *meta;
    char *data;
};

static uint64_t up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

struct layout { uint64_t local, stride, global, meta, data, size; };

static struct layout layout(uint32_t workers, uint32_t ring, uint32_t slots, uint32_t slot_size)
{
    struct layout l;
    l.local = up(sizeof(struct header), CL);
    l.stride = up(sizeof(struct local) + (uint64_t)ring * 8, CL);
    l.global = l.local + workers * l.stride;
    l.meta = l.global + up(sizeof(struct global) + (uint64_t)ring * sizeof(struct gcell), CL);
    l.data = l.meta + up((uint64_t)slots * sizeof(struct meta), CL);
    l.size = up(l.data + (uint64_t)slots * slot_size, 4096);
    return l;
}

static int params_ok(uint32_t workers, uint32_t ring, uint32_t slots, uint32_t slot_size)
{
    return workers >= 1 && workers <= 4096 && ring >= 2 && ring <= (1u << 24) &&
           (ring & (ring - 1)) == 0 && slots >= 1 && slots < IDX_NIL && slot_size >= 1 &&
           slot_size <= (1u << 24);
}

uint64_t rq_region_size(uint32_t workers, uint32_t ring_size, uint32_t slots, uint32_t slot_size)
{
    return params_ok(workers, ring_size, slots, slot_size)
               ? layout(workers, ring_size, slots, slot_size).size : 0;
}

static inline struct local *LOCAL(struct rq *q, uint32_t w)
{
    return (struct local *)(q->base + up(sizeof(struct header), CL) + w * q->stride);
}

static struct rq *handle(char *base, uint64_t size, const struct header *h)
{
    struct layout l = layout(h->workers, h->ring_size, h->slots, h->slot_size);
    struct rq *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->base = base;
    q->size = size;
    q->stride = l.stride;
    q->mask = h->ring_size - 1;
    q->workers = h->workers;
    q->slots = h->slots;
    q->slot_size = h->slot_size;
    q->h = (struct header *)base;
    q->g = (struct global *)(base + l.global);
    q->meta = (struct meta *)(base + l.meta);
    q->data = base + l.data;
    return q;
}

struct rq *rq_create(int fd, uint32_t workers, uint32_t ring_size, uint32_t slots,
                     uint32_t slot_size, int *err)
{
    uint64_t size = rq_region_size(workers, ring_size, slots, slot_size);
    if (!size) {
        *err = EINVAL;
        return NULL;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        *err = errno;
        return NULL;
    }
    char *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        *err = errno;
        return NULL;
    }
    struct header *h = (struct header *)base;
    h->version = VERSION;
    h->workers = workers;
    h->ring_size = ring_size;
    h->slots = slots;
    h->slot_size = slot_size;
    h->size = size;
    struct rq *q = handle(base, size, h);
    if (!q) {
        munmap(base, size);
        *err = ENOMEM;
        return NULL;
    }
    /* The file may not be new: set every word a reader looks at. */
    for (uint32_t w = 0; w < workers; w++) {
        struct local *l = LOCAL(q, w);
        atomic_init(&l->head, 0);
        atomic_init(&l->tail, 0);
        atomic_init(&l->futex, 0);
        atomic_init(&l->sleeping, 0);
        atomic_init(&l->woken, 0);
    }
    atomic_init(&q->g->enq, 0);
    atomic_init(&q->g->deq, 0);
    for (uint64_t i = 0; i < ring_size; i++)
        atomic_init(&q->g->cell[i].seq, i);
    for (uint32_t i = 0; i < slots; i++) {
        atomic_init(&q->meta[i].next, i + 1 < slots ? i + 1 : IDX_NIL);
        atomic_init(&q->meta[i].gen, 0);
    }
    atomic_init(&h->free_head, 0);
    atomic_init(&h->sleepers, 0);
    atomic_store_explicit(&h->magic, MAGIC, REL);
    return q;
}

struct rq *rq_attach(int fd, int *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *err = errno;
        return NULL;
    }
    uint64_t size = (uint64_t)st.st_size;
    *err = EPROTO;                    /* not a region of ours, unless a syscall says otherwise */
    if (size < sizeof(struct header))
        return NULL;
    char *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        *err = errno;
        return NULL;
    }
    struct header *h = (struct header *)base;
    /* Sizes are recomputed from the parameters, never trusted from the region. */
    if (atomic_load_explicit(&h->magic, ACQ) != MAGIC || h->version != VERSION ||
        rq_region_size(h->workers, h->ring_size, h->slots, h->slot_size) != size ||
        h->size != size) {
        munmap(base, size);
        return NULL;
    }
    struct rq *q = handle(base, size, h);
    if (!q) {
        munmap(base, size);
        *err = ENOMEM;
    }
    return q;
}

void rq_close(struct rq *q)
{
    if (q) {
        munmap(q->base, q->size);
        free(q);
    }
}

void rq_params(struct rq *q, uint32_t out[4])
{
    out[0] = q->workers;
    out[1] = (uint32_t)(q->mask + 1);
    out[2] = q->slots;
    out[3] = q->slot_size;
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)word, op, val, ts, NULL, 0);
}

/* ---- payload slots: a Treiber stack of free indices ---- */

static inline uint64_t bump(uint64_t head, uint32_t idx)
{
    return (((head >> IDX_BITS) + 1) << IDX_BITS) | idx;   /* the tag wraps after 2^40 */
}

int64_t rq_alloc_begin(struct rq *q, uint64_t *head, uint32_t *next)
{
    /* acquire: the free-er's link (and its last reads of the slot) come before its release */
    uint64_t hd = atomic_load_explicit(&q->h->free_head, ACQ);
    uint32_t idx = (uint32_t)(hd & IDX_MASK);
    if (idx >= q->slots)
        return -1;
    /* The slot may be taken and relinked meanwhile; then the tag moved and the CAS fails. */
    *next = atomic_load_explicit(&q->meta[idx].next, RLX);
    *head = hd;
    return idx;
}

int rq_alloc_commit(struct rq *q, uint64_t head, uint32_t next)
{
    return atomic_compare_exchange_strong_explicit(&q->h->free_head, &head,
                                                   bump(head, next), ACQ, RLX);
}

uint64_t rq_slot_alloc(struct rq *q)
{
    for (;;) {
        uint64_t head;
        uint32_t next;
        int64_t idx = rq_alloc_begin(q, &head, &next);
        if (idx < 0)
            return RQ_NIL;
        if (rq_alloc_commit(q, head, next)) {
            uint64_t gen = atomic_load_explicit(&q->meta[idx].gen, RLX);
            return gen << 32 | (uint64_t)idx;
        }
    }
}

static void slot_free(struct rq *q, uint32_t idx)
{
    struct meta *m = &q->meta[idx];
    /* Entries still naming the use that ends here no longer match the slot. */
    atomic_fetch_add_explicit(&m->gen, 1, RLX);
    uint64_t old = atomic_load_explicit(&q->h->free_head, RLX);
    do
        atomic_store_explicit(&m->next, (uint32_t)(old & IDX_MASK), RLX);
    /* release: the link, the generation and our reads of the payload precede reuse */
    while (!atomic_compare_exchange_weak_explicit(&q->h->free_head, &old, bump(old, idx), REL,
                                                  RLX));
}

static int entry_ok(struct rq *q, uint64_t e)
{
    uint32_t idx = (uint32_t)e;
    return idx < q->slots &&
           atomic_load_explicit(&q->meta[idx].gen, RLX) == (uint32_t)(e >> 32);
}

void rq_slot_free(struct rq *q, uint64_t e)
{
    if (entry_ok(q, e))
        slot_free(q, (uint32_t)e);
}

static uint64_t fill(struct rq *q, const char *data, uint32_t len)
{
    uint64_t e = rq_slot_alloc(q);
    if (e != RQ_NIL) {
        uint32_t idx = (uint32_t)e;
        memcpy(q->data + (uint64_t)idx * q->slot_size, data, len);
        q->meta[idx].len = len;
    }
    return e;
}

static int64_t consume(struct rq *q, uint64_t e, char *out, uint32_t cap)
{
    if (!entry_ok(q, e))
        return RQ_CORRUPT;
    uint32_t idx = (uint32_t)e, len = q->meta[idx].len;
    if (len > cap)
        len = cap;
    memcpy(out, q->data + (uint64_t)idx * q->slot_size, len);
    slot_free(q, idx);
    return len;
}

/* ---- sleeping ---- */

static int claim(struct rq *q, uint32_t w)
{
    struct local *l = LOCAL(q, w);
    uint32_t one = 1;
    /* Whoever clears the flag (a waker or the sleeper itself) takes it off the count. */
    if (!atomic_compare_exchange_strong_explicit(&l->sleeping, &one, 0, SC, RLX))
        return 0;
    atomic_fetch_sub_explicit(&q->h->sleepers, 1, RLX);
    return 1;
}

static void kick(struct rq *q, uint32_t w)
{
    struct local *l = LOCAL(q, w);
    atomic_fetch_add_explicit(&l->futex, 1, REL);
    futex(&l->futex, FUTEX_WAKE, 1, NULL);
}

/* After publishing an entry: wake `first` if it sleeps, else one other sleeper (to take it
 * from the global ring or to steal it). */
static void wake_one(struct rq *q, uint32_t first)
{
    atomic_thread_fence(SC);          /* the entry's store before the sleepers' load (Dekker) */
    if (atomic_load_explicit(&q->h->sleepers, RLX) == 0)
        return;
    for (uint32_t i = 0; i < q->workers; i++) {
        uint32_t w = (first + i) % q->workers;
        if (atomic_load_explicit(&LOCAL(q, w)->sleeping, RLX) && claim(q, w)) {
            kick(q, w);
            return;
        }
    }
}

/* A request that outlives the moment: a wake that lands before the worker reads its futex
 * word would otherwise be lost, and the caller (stop, new policy) cannot tell. */
void rq_wake(struct rq *q, uint32_t w)
{
    atomic_store_explicit(&LOCAL(q, w)->woken, 1, SC);
    claim(q, w);
    kick(q, w);
}

uint32_t rq_sleepers(struct rq *q)
{
    return atomic_load_explicit(&q->h->sleepers, RLX);
}

uint64_t rq_local_len(struct rq *q, uint32_t w)
{
    struct local *l = LOCAL(q, w);
    uint64_t h = atomic_load_explicit(&l->head, ACQ);   /* head first: then tail >= head */
    uint64_t t = atomic_load_explicit(&l->tail, ACQ);
    return t - h;
}

uint64_t rq_global_len(struct rq *q)
{
    uint64_t d = atomic_load_explicit(&q->g->deq, ACQ);
    uint64_t e = atomic_load_explicit(&q->g->enq, ACQ);
    return e > d ? e - d : 0;
}

static int has_work(struct rq *q)
{
    if (rq_global_len(q))
        return 1;
    for (uint32_t w = 0; w < q->workers; w++)   /* its own ring, or one to steal from */
        if (rq_local_len(q, w))
            return 1;
    return 0;
}

static int woken(struct local *l)
{
    return atomic_load_explicit(&l->woken, RLX) && atomic_exchange_explicit(&l->woken, 0, ACQ);
}

int rq_wait(struct rq *q, uint32_t w, int64_t timeout_ns)
{
    struct local *l = LOCAL(q, w);
    if (has_work(q))
        return 1;
    /* The spin watches only our lines and the global ring's: scanning every worker's head
     * and tail each round would cost a cache miss per worker per round on a big machine. */
    for (int i = 0; i < SPINS; i++) {
        if (rq_local_len(q, w) || rq_global_len(q) || woken(l))
            return 1;
        relax();
    }
    uint64_t word;
    uint32_t seq;
    if (rq_wait_begin(q, w, &word, &seq))
        return 1;
    struct timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
    long r = futex(&l->futex, FUTEX_WAIT, seq, timeout_ns < 0 ? NULL : &ts);
    int err = errno;
    rq_wait_end(q, w);                /* answered by this return */
    return r == 0 || err == EAGAIN;   /* woken, or the word moved before we slept */
}

/* ---- local rings (owner pushes; anyone pops; thieves grab half) ---- */

int rq_push_local(struct rq *q, uint32_t w, const char *data, uint32_t len)
{
    if (len > q->slot_size)
        return RQ_TOOBIG;
    struct local *l = LOCAL(q, w);
    uint64_t t = atomic_load_explicit(&l->tail, RLX);   /* ours alone */
    /* acquire: consumers read a cell before their release CAS moved head past it, so a cell
     * below head is ours to overwrite */
    uint64_t h = atomic_load_explicit(&l->head, ACQ);
    if (t - h > q->mask)
        return RQ_FULL;               /* and stays full until we push: only we push */
    uint64_t e = fill(q, data, len);
    if (e == RQ_NIL)
        return RQ_NOSLOT;
    atomic_store_explicit(&l->cell[t & q->mask], e, RLX);
    atomic_store_explicit(&l->tail, t + 1, REL);        /* publishes the cell and the payload */
    wake_one(q, w);
    return RQ_PUSHED;
}

int64_t rq_pop_local(struct rq *q, uint32_t w, char *out, uint32_t cap)
{
    struct local *l = LOCAL(q, w);
    uint64_t h = atomic_load_explicit(&l->head, ACQ);
    for (;;) {
        uint64_t t = atomic_load_explicit(&l->tail, ACQ);
        if ((int64_t)(t - h) <= 0)
            return RQ_EMPTY;
        /* With a stale h this cell may have been reused: the CAS below then fails. */
        uint64_t e = atomic_load_explicit(&l->cell[h & q->mask], RLX);
        /* release: our read of the cell before the owner, acquiring head, overwrites it */
        if (atomic_compare_exchange_weak_explicit(&l->head, &h, h + 1, REL, ACQ))
            return consume(q, e, out, cap);
    }
}

int64_t rq_steal_begin(struct rq *q, uint32_t thief, uint32_t victim, uint64_t *head)
{
    struct local *tl = LOCAL(q, thief), *vl = LOCAL(q, victim);
    uint64_t size = q->mask + 1;
    uint64_t tt = atomic_load_explicit(&tl->tail, RLX);
    uint64_t room = size - (tt - atomic_load_explicit(&tl->head, ACQ));
    for (;;) {
        uint64_t h = atomic_load_explicit(&vl->head, ACQ);
        uint64_t t = atomic_load_explicit(&vl->tail, ACQ);
        uint64_t n = t - h;
        if ((int64_t)n <= 0)
            return 0;
        if (n > size)
            continue;                 /* head moved between the two loads: look again */
        n -= n / 2;
        if (n > room)
            n = room;
        /* Cells past our tail are read by nobody until the commit publishes them. */
        for (uint64_t i = 0; i < n; i++)
            atomic_store_explicit(&tl->cell[(tt + i) & q->mask],
                                  atomic_load_explicit(&vl->cell[(h + i) & q->mask], RLX), RLX);
        *head = h;
        return (int64_t)n;
    }
}

int64_t rq_steal_commit(struct rq *q, uint32_t thief, uint32_t victim, uint64_t head,
                        uint64_t n)
{
    struct local *tl = LOCAL(q, thief), *vl = LOCAL(q, victim);
    /* Succeeds only if no entry left the victim since steal_begin read head (head only
     * grows), so the copies are the entries h..h+n-1, each now ours alone. release: as in
     * rq_pop_local. */
    if (!atomic_compare_exchange_strong_explicit(&vl->head, &head, head + n, REL, RLX))
        return 0;
    uint64_t tt = atomic_load_explicit(&tl->tail, RLX);
    atomic_store_explicit(&tl->tail, tt + n, REL);
    return (int64_t)n;
}

int64_t rq_steal(struct rq *q, uint32_t thief, uint32_t victim)
{
    for (;;) {
        uint64_t head;
        int64_t n = rq_steal_begin(q, thief, victim, &head);
        if (n <= 0 || rq_steal_commit(q, thief, victim, head, (uint64_t)n))
            return n;
    }
}

uint64_t rq_local_entry(struct rq *q, uint32_t w, uint64_t pos)
{
    return atomic_load_explicit(&LOCAL(q, w)->cell[pos & q->mask], RLX);
}

/* ---- the global ring (Vyukov): any process pushes and pops ---- */

int rq_push_global(struct rq *q, const char *data, uint32_t len)
{
    if (len > q->slot_size)
        return RQ_TOOBIG;
    struct global *g = q->g;
    if (rq_global_len(q) > q->mask)
        return RQ_FULL;               /* a cheap early answer; the loop below decides */
    uint64_t e = fill(q, data, len);
    if (e == RQ_NIL)
        return RQ_NOSLOT;
    uint64_t pos = atomic_load_explicit(&g->enq, RLX);
    struct gcell *c;
    for (;;) {
        c = &g->cell[pos & q->mask];
        /* acquire: the last consumer of this cell read its entry before releasing seq */
        uint64_t seq = atomic_load_explicit(&c->seq, ACQ);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&g->enq, &pos, pos + 1, RLX, RLX))
                break;
        } else if (dif < 0) {
            slot_free(q, (uint32_t)e);
            return RQ_FULL;
        } else {
            pos = atomic_load_explicit(&g->enq, RLX);
        }
    }
    atomic_store_explicit(&c->entry, e, RLX);
    atomic_store_explicit(&c->seq, pos + 1, REL);        /* the cell is the consumers' now */
    wake_one(q, (uint32_t)(pos % q->workers));           /* spread wakes over the workers */
    return RQ_PUSHED;
}

int64_t rq_pop_global(struct rq *q, char *out, uint32_t cap)
{
    struct global *g = q->g;
    uint64_t pos = atomic_load_explicit(&g->deq, RLX);
    struct gcell *c;
    for (;;) {
        c = &g->cell[pos & q->mask];
        uint64_t seq = atomic_load_explicit(&c->seq, ACQ);   /* pairs with the producer's */
        int64_t dif = (int64_t)(seq - (pos + 1));
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&g->deq, &pos, pos + 1, RLX, RLX))
                break;
        } else if (dif < 0) {
            return RQ_EMPTY;
        } else {
            pos = atomic_load_explicit(&g->deq, RLX);
        }
    }
    uint64_t e = atomic_load_explicit(&c->entry, RLX);
    atomic_store_explicit(&c->seq, pos + q->mask + 1, REL);   /* producers' turn, next lap */
    return consume(q, e, out, cap);
}

uint64_t rq_free_count(struct rq *q)
{
    uint64_t n = 0;
    uint32_t idx = (uint32_t)(atomic_load_explicit(&q->h->free_head, ACQ) & IDX_MASK);
    while (idx < q->slots && n <= q->slots) {
        n++;
        idx = atomic_load_explicit(&q->meta[idx].next, RLX);
    }
    return n;
}

/* The slice timer: a POSIX timer on the calling thread's CPU-time clock, delivered to that
 * thread alone (SIGEV_THREAD_ID), not to whichever thread of the process the kernel picks.
 * Raw syscalls: glibc wraps kernel timer ids in a timer_t of its own and, before 2.34,
 * lives in librt; the kernel's int id is all the caller needs. */
#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid   /* glibc < 2.35 names only the union member */
#endif

int rq_cputimer_create(int signo)
{
    struct sigevent sev;
    int id = -1;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = signo;
    sev.sigev_notify_thread_id = (pid_t)syscall(SYS_gettid);
    if (syscall(SYS_timer_create, CLOCK_THREAD_CPUTIME_ID, &sev, &id) < 0)
        return -errno;
    return id;
}

static struct timespec ts_of(int64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    return ts;
}

int rq_cputimer_set(int id, int64_t first_ns, int64_t interval_ns)
{
    struct itimerspec its = {.it_value = ts_of(first_ns), .it_interval = ts_of(interval_ns)};
    if (first_ns < 0 || interval_ns < 0)
        return -EINVAL;
    return syscall(SYS_timer_settime, id, 0, &its, NULL) < 0 ? -errno : 0;
}

int rq_cputimer_get(int id, int64_t out[2])
{
    struct itimerspec its;
    if (syscall(SYS_timer_gettime, id, &its) < 0)
        return -errno;
    out[0] = (int64_t)its.it_value.tv_sec * 1000000000 + its.it_value.tv_nsec;
    out[1] = (int64_t)its.it_interval.tv_sec * 1000000000 + its.it_interval.tv_nsec;
    return 0;
}

int rq_cputimer_delete(int id)
{
    return syscall(SYS_timer_delete, id) < 0 ? -errno : 0;
}

/* ---- sleeping elsewhere (see runq.h): rq_wait's protocol, the FUTEX_WAIT left to the caller ---- */

int rq_wait_begin(struct rq *q, uint32_t w, uint64_t *word, uint32_t *seq)
{
    struct local *l = LOCAL(q, w);
    if (has_work(q) || woken(l))
        return 1;
    *seq = atomic_load_explicit(&l->futex, ACQ);
    atomic_store_explicit(&l->sleeping, 1, SC);
    atomic_fetch_add_explicit(&q->h->sleepers, 1, SC);
    atomic_thread_fence(SC);          /* the announcement before the last look (Dekker) */
    if (has_work(q) || woken(l)) {
        claim(q, w);
        return 1;
    }
    *word = (uint64_t)(uintptr_t)&l->futex;
    return 0;
}

void rq_wait_end(struct rq *q, uint32_t w)
{
    claim(q, w);
    atomic_exchange_explicit(&LOCAL(q, w)->woken, 0, ACQ);   /* answered by this sleep */
}
