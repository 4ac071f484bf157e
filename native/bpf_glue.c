#include <stddef.h>
#include <stdint.h>

#include "bpf_glue.h"

#include <errno.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bpf/libbpf.h>

/* --- libbpf log capture ------------------------------------------------------
 * libbpf reports the cause of a failure (verifier log, missing BTF, relocation
 * error) only through its print callback. Keep the newest LOG_CAP bytes so the
 * Python side can attach them to the OSError it raises. */
#define LOG_CAP (64 * 1024)
static char log_buf[LOG_CAP];
static size_t log_len;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static int capture_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
    char small[4096], *line = small;
    const char *text;
    va_list again;
    int n;

    if (level == LIBBPF_DEBUG)
        return 0;
    va_copy(again, ap);
    n = vsnprintf(small, sizeof(small), fmt, ap);
    /* A verifier log comes as one message and names its failure at the end: format it
     * whole rather than keep its first 4 KiB. */
    if (n >= (int)sizeof(small)) {
        line = malloc((size_t)n + 1);
        if (line)
            vsnprintf(line, (size_t)n + 1, fmt, again);
        else {
            line = small;
            n = sizeof(small) - 1;
        }
    }
    va_end(again);
    if (n <= 0)
        goto out;
    text = line;
    if ((size_t)n > LOG_CAP) {            /* its tail alone */
        text = line + (n - LOG_CAP);
        n = LOG_CAP;
    }
    pthread_mutex_lock(&log_lock);
    if (log_len + n > LOG_CAP) {          /* drop the oldest text */
        size_t drop = log_len + n - LOG_CAP;
        if (drop > log_len)
            drop = log_len;
        memmove(log_buf, log_buf + drop, log_len - drop);
        log_len -= drop;
    }
    memcpy(log_buf + log_len, text, n);
    log_len += n;
    pthread_mutex_unlock(&log_lock);
out:
    if (line != small)
        free(line);
    return n;
}

void xh_log_capture(int enable)
{
    libbpf_set_print(enable ? capture_print : NULL);
}

size_t xh_log_take(char *out, size_t cap)
{
    size_t n;

    pthread_mutex_lock(&log_lock);
    n = log_len < cap ? log_len : cap;
    /* keep the tail: the last messages name the failure; cap 0 just clears */
    if (n)
        memcpy(out, log_buf + (log_len - n), n);
    log_len = 0;
    pthread_mutex_unlock(&log_lock);
    return n;
}

/* --- ring buffer --------------------------------------------------------------- */
#define SINK_CHUNK (1u << 20)   /* write(2) in chunks this big: few syscalls per second */

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int xh_rb_flush(struct xh_rb *r)
{
    int err;

    if (r->out_fd < 0 || !r->len)
        return r->err;
    err = write_all(r->out_fd, r->buf, r->len);
    if (err) {
        if (!r->err)
            r->err = err;
        return err;
    }
    r->written += r->count;
    r->len = 0;
    r->count = 0;
    return r->err;
}

static int rb_append(void *ctx, void *data, size_t size)
{
    struct xh_rb *r = ctx;

    if (r->out_fd >= 0 && size != r->record_size) {
        r->bad++;                         /* a foreign record would corrupt the file */
        return 0;
    }
    if (r->len + size > r->cap) {
        size_t cap = r->cap ? r->cap : 64 * 1024;
        char *p;
        while (cap < r->len + size)
            cap *= 2;
        p = realloc(r->buf, cap);
        if (!p) {
            r->err = -ENOMEM;
            return -ENOMEM;               /* stops this poll; surfaced by xh_rb_poll */
        }
        r->buf = p;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, data, size);
    r->len += size;
    r->count++;
    if (r->out_fd >= 0 && r->len >= SINK_CHUNK) {
        int err = xh_rb_flush(r);
        if (err)
            return err;                   /* stops this poll; surfaced by xh_rb_poll */
    }
    return 0;
}

struct xh_rb *xh_rb_new(int map_fd)
{
    struct xh_rb *r = calloc(1, sizeof(*r));
    int err;

    if (!r)
        return NULL;
    r->out_fd = -1;
    r->rb = ring_buffer__new(map_fd, rb_append, r, NULL);
    if (!r->rb) {
        err = errno;
        free(r);
        errno = err;
        return NULL;
    }
    return r;
}

struct xh_rb *xh_rb_new_sink(int map_fd, int out_fd, size_t record_size)
{
    struct xh_rb *r;

    if (out_fd < 0 || !record_size) {
        errno = EINVAL;
        return NULL;
    }
    r = xh_rb_new(map_fd);
    if (r) {
        r->out_fd = out_fd;
        r->record_size = record_size;
    }
    return r;
}

void xh_rb_sink_stats(struct xh_rb *r, uint64_t *written, uint64_t *buffered, uint64_t *bad)
{
    *written = r->written;
    *buffered = r->count;
    *bad = r->bad;
}

int xh_rb_poll(struct xh_rb *r, int timeout_ms)
{
    int n = ring_buffer__poll(r->rb, timeout_ms);
    return r->err ? r->err : n;
}

int xh_rb_consume(struct xh_rb *r)
{
    int n = ring_buffer__consume(r->rb);
    return r->err ? r->err : n;
}

const char *xh_rb_data(struct xh_rb *r, size_t *len, uint64_t *count)
{
    *len = r->len;
    *count = r->count;
    return r->buf;
}

void xh_rb_reset(struct xh_rb *r)
{
    r->len = 0;
    r->count = 0;
    r->err = 0;
    /* give back a buffer that a burst grew past 4 MiB */
    if (r->cap > 4u << 20) {
        free(r->buf);
        r->buf = NULL;
        r->cap = 0;
    }
}

void xh_rb_free(struct xh_rb *r)
{
    if (!r)
        return;
    ring_buffer__free(r->rb);
    free(r->buf);
    free(r);
}

/* --- perf events --------------------------------------------------------------- */
int xh_perf_event_open(uint32_t type, uint64_t config, int pid, int cpu,
                       uint64_t period_or_freq, int use_freq, int disabled)
{
    struct perf_event_attr attr;
    long fd;

    memset(&attr, 0, sizeof(attr));
    attr.size = sizeof(attr);
    attr.type = type;
    attr.config = config;
    attr.disabled = disabled ? 1 : 0;
    if (use_freq) {
        attr.freq = 1;
        attr.sample_freq = period_or_freq;
    } else {
        attr.sample_period = period_or_freq;
    }
    fd = syscall(SYS_perf_event_open, &attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC);
    return fd < 0 ? -errno : (int)fd;
}
