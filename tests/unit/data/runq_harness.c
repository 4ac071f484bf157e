/* Test harness for native/runq.c, built by tests/unit/test_runtime_queues_procs.py.
 *
 *   runq_harness stress  threads push, pop, steal and wait as the pool's processes do; run
 *                        under ThreadSanitizer, which checks the release/acquire argument
 *                        for the plain payload and length accesses (x86 alone would not)
 *   runq_harness bench   ns per push+pop round trip, local and global, without Python */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "runq.h"

#define W 3
#define PER 20000
#define SUB 30000
#define TOTAL (W * PER + SUB)
#define SLOTS 20

static struct rq *q;
static _Atomic int seen[TOTAL];
static _Atomic long done, stolen;

static uint32_t make(uint32_t id, char *buf)
{
    uint32_t len = 4 + id % 57;
    memcpy(buf, &id, 4);
    memset(buf + 4, id % 251, len - 4);
    return len;
}

static void take(const char *buf, int64_t n)
{
    char want[64];
    uint32_t id;
    if (n < 4)
        abort();
    memcpy(&id, buf, 4);
    if (id >= TOTAL || make(id, want) != n || memcmp(want, buf, n)) {
        fprintf(stderr, "item %u came out altered\n", id);
        abort();
    }
    atomic_fetch_add(&seen[id], 1);
    atomic_fetch_add(&done, 1);
}

static void *worker(void *arg)
{
    uint32_t w = (uint32_t)(uintptr_t)arg, next = w * PER, end = (w + 1) * PER;
    unsigned seed = w + 1;
    char buf[64], out[64];
    while (atomic_load(&done) < TOTAL) {
        for (int i = rand_r(&seed) % 5; i > 0; i--)
            if (next < end && rq_push_local(q, w, buf, make(next, buf)) == RQ_PUSHED)
                next++;
        int64_t n = rq_pop_local(q, w, out, 64);
        if (n == RQ_EMPTY)
            n = rq_pop_global(q, out, 64);
        if (n == RQ_EMPTY) {
            uint32_t v = rand_r(&seed) % W;
            int64_t s;
            if (v != w && (s = rq_steal(q, w, v)) > 0) {
                atomic_fetch_add(&stolen, s);
                n = rq_pop_local(q, w, out, 64);
            }
        }
        if (n >= 0)
            take(out, n);
        else if (n != RQ_EMPTY)
            abort();
        else if (next >= end)
            rq_wait(q, w, 1000000);
    }
    return NULL;
}

static void *submitter(void *arg)
{
    char buf[64];
    (void)arg;
    for (uint32_t i = W * PER; i < TOTAL; i++)
        while (rq_push_global(q, buf, make(i, buf)) != RQ_PUSHED)
            sched_yield();
    return NULL;
}

static int stress(void)
{
    int err;
    /* Rings of 8 and 20 slots: full rings, no free slot, and many laps. */
    q = rq_create(memfd_create("runq-stress", 0), W, 8, SLOTS, 64, &err);
    if (!q)
        return 2;
    pthread_t t[W + 1];
    for (uintptr_t w = 0; w < W; w++)
        pthread_create(&t[w], NULL, worker, (void *)w);
    pthread_create(&t[W], NULL, submitter, NULL);
    for (int i = 0; i <= W; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < TOTAL; i++)
        if (seen[i] != 1) {
            fprintf(stderr, "item %d came out %d times\n", i, seen[i]);
            return 1;
        }
    printf("%d %ld %llu\n", TOTAL, (long)stolen, (unsigned long long)rq_free_count(q));
    return rq_free_count(q) == SLOTS ? 0 : 1;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int bench(void)
{
    int err, n = 2000000;
    char in[100] = {0}, out[1024];
    q = rq_create(memfd_create("runq-bench", 0), 2, 4096, 16384, 1024, &err);
    if (!q)
        return 2;
    double t0 = now();
    for (int i = 0; i < n; i++) {
        rq_push_local(q, 0, in, 100);
        rq_pop_local(q, 0, out, 1024);
    }
    double t1 = now();
    for (int i = 0; i < n; i++) {
        rq_push_global(q, in, 100);
        rq_pop_global(q, out, 1024);
    }
    double t2 = now();
    printf("%.1f %.1f\n", (t1 - t0) / n, (t2 - t1) / n);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "stress"))
        return stress();
    if (argc == 2 && !strcmp(argv[1], "bench"))
        return bench();
    fprintf(stderr, "usage: runq_harness stress|bench\n");
    return 2;
}
