/* C helpers for the xhagent._bpf binding: what cannot be a plain libbpf call from
 * Python without a per-event Python callback or a va_list.
 * Plain declarations only: native/bpf_build.py hands this file to cffi's cdef as it is,
 * so no includes or guards here (include <stddef.h> and <stdint.h> first). */

struct ring_buffer;

/* libbpf's messages, captured instead of printed to stderr. */
void xh_log_capture(int enable);
size_t xh_log_take(char *out, size_t cap);   /* copy the tail out, clear; returns bytes */

/* A libbpf ring buffer whose sample callback appends records to a growable
 * buffer that Python drains in bulk. Records are concatenated as they arrive. */
struct xh_rb {
    struct ring_buffer *rb;
    char *buf;
    size_t len, cap;
    uint64_t count;   /* records in buf */
    int err;          /* first append failure (-ENOMEM, or a write errno), sticky until reset */
    /* sink mode (xh_rb_new_sink): records go to out_fd instead of Python */
    int out_fd;       /* -1: drain mode */
    size_t record_size;
    uint64_t written; /* records written to out_fd so far */
    uint64_t bad;     /* records of another size, skipped */
};

struct xh_rb *xh_rb_new(int map_fd);    /* NULL with errno set */
int xh_rb_poll(struct xh_rb *r, int timeout_ms);
int xh_rb_consume(struct xh_rb *r);
const char *xh_rb_data(struct xh_rb *r, size_t *len, uint64_t *count);
void xh_rb_reset(struct xh_rb *r);
void xh_rb_free(struct xh_rb *r);

/* Sink mode: fixed-size records are appended to out_fd (buffered, written in
 * large chunks) without Python seeing them; xh_rb_poll/xh_rb_consume drive it.
 * xh_rb_flush writes what is buffered: 0 or -errno. */
struct xh_rb *xh_rb_new_sink(int map_fd, int out_fd, size_t record_size);
int xh_rb_flush(struct xh_rb *r);
void xh_rb_sink_stats(struct xh_rb *r, uint64_t *written, uint64_t *buffered, uint64_t *bad);

/* perf_event_open(2): returns an fd or -errno. period_or_freq is a sample period
 * unless use_freq is set. The fd is always close-on-exec. */
int xh_perf_event_open(uint32_t type, uint64_t config, int pid, int cpu,
                       uint64_t period_or_freq, int use_freq, int disabled);
