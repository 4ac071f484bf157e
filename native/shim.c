/* shim.c: xhagent-shim, the supervisor of one workload (the containerd-shim pattern).
 *
 *   xhagent-shim --dir TASKDIR --cgroup CGROUPDIR [--log-cap BYTES] [--keep-free BYTES]
 *                [--cwd DIR] [--uid N --gid N] [--oom-score-adj N] [--method clone3|fork]
 *                [--spare SPAREDIR] -- PROG [ARGS...]
 *
 * The agent starts it as a new session in a leaf of its own; it starts PROG inside CGROUPDIR
 * (xh_spawn, spawn_glue.c), copies its stdout and stderr into TASKDIR (each file made at
 * the stream's first byte, each up to --log-cap bytes, and never into the last --keep-free
 * bytes of the filesystem, which are the agent's for its records and its store: output
 * beyond either is read, dropped and counted), waits for it and writes its end into
 * TASKDIR/exit. The workload is this process's child, not the agent's, so its status
 * survives the agent's death: a restarted agent reads TASKDIR instead of waiting. With
 * --oom-score-adj the workload starts with that oom_score_adj, while the shim keeps its
 * own (the agent's, which the OOM killer is told to spare: the workloads are not).
 *
 * TASKDIR/started  {"shim_pid":N,"shim_start_time":N,"pid":N,"start_time":N,
 *                   "spawn_method":"clone3"|"fork","started_ns":N}
 * TASKDIR/stdout.times, stderr.times: where each second's output begins in its stream, for
 *                   `logs --since`: 16-byte marks (u64 CLOCK_REALTIME ns, u64 offset, little
 *                   endian), one before the first byte kept in each second, TIMES_MAX at most
 * TASKDIR/exit     {"exit_code":N | "signal":N,"core_dumped":B, "ended_ns":N,
 *                   "stdout_dropped":N,"stderr_dropped":N[,"output_errno":N]}
 *              or  {"error":STAGE,"errno":N,"message":TEXT}  (no workload runs any more)
 * Each is one line of JSON, written to NAME.tmp and renamed; `exit` is fsynced before its
 * rename and the directory after it: a crash leaves either no file or a whole one (for
 * `started`, not flushed, also one of the reservation's filler alone: see write_record).
 * The space of both is secured before the workload starts (NAME.tmp created and
 * RECORD_SIZE bytes written; the record is written over them in place and the file cut to
 * its length), so a workload that fills the disk cannot cost its own exit status. A shim that cannot secure that space (or write a
 * record at all) starts nothing and writes its error record on its stdout instead: the
 * agent's pipe until `started` is written. TASKDIR and its parent are made when missing
 * (0750): by the shim, beside the agent, and not by the agent's scheduler loop; or, with
 * --spare, the parent is SPAREDIR renamed, with TASKDIR and both reservations in it already
 * (a spare run directory, shim_spares.c): a start then allocates no inode. start_time
 * fields are field 22 of /proc/PID/stat (clock ticks since boot): with the pid they name one
 * process, never a reuse.
 *
 * Exit status: 0 once `exit` holds the workload's end; 1 when `exit` holds an error (or could
 * not be written: then stdout has it, where it could be written); 2 for a bad command line
 * (before TASKDIR is known: stderr only).
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"
#include "spawn_glue.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

#define DEFAULT_LOG_CAP (16ULL << 20)
/* No --oom-score-adj: the workload keeps the shim's (which is the agent's). */
#define OOM_AS_IS (-(1LL << 32))
/* The most a record holds (struct json's buffer, a line of JSON): what is reserved for each. */
/* After the workload ends, how long a process that still holds its stdout or stderr (a
 * background grandchild) may delay the exit record: its later output is not worth an agent
 * that cannot learn the status. */
#define DRAIN_GRACE_MS 2000
/* Reads per pipe once the grace is over: a writer that keeps going must not keep us here. */
#define FINAL_READS 16

extern char **environ;

static char iobuf[65536];
static int task_fd = -1;  /* TASKDIR */
static int log_fd = -1;   /* TASKDIR/shim.log, opened on the first message */
static int reserved_fd[2] = {-1, -1};  /* started.tmp, exit.tmp: their space secured */
static pid_t child_pid = -1;
static int child_pidfd = -1;

/* Marks of a stream's time index at most: 1 MiB, 18 hours of output in every second. */
#define TIMES_MAX 65536

struct sink {
    const char *name;  /* the file in TASKDIR */
    const char *times_name;  /* its time index in TASKDIR (mark_time) */
    int times;         /* the index, -1 until its first mark */
    int times_stopped; /* no more marks: the index is full or could not be written */
    long long last_sec;     /* the second of the last mark */
    unsigned long long marks;
    int in;            /* read end of the workload's pipe; -1 once at EOF */
    int out;           /* the file */
    unsigned long long size, cap, dropped;
    unsigned long long keep_free;  /* bytes of the filesystem the output must leave free */
    int write_errno;   /* the first failed write (later output is counted as dropped) */
};

/* ---- messages and records ------------------------------------------------------------- */

__attribute__((format(printf, 1, 2)))
static void note(const char *fmt, ...)
{
    static char line[8192];
    int n = snprintf(line, sizeof line, "xhagent-shim[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2)
        n = sizeof line - 2;
    line[n++] = '\n';
    if (log_fd < 0 && task_fd >= 0)
        log_fd = openat(task_fd, "shim.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW,
                        0640);
    /* best effort by nature: there is nowhere further to report a failed report */
    if (write(log_fd >= 0 ? log_fd : STDERR_FILENO, line, n) < 0)
        return;
}

struct json {
    char s[RECORD_SIZE];
    size_t n;
};

static void jraw(struct json *j, const char *t)
{
    size_t len = strlen(t);
    if (j->n + len < sizeof j->s) {
        memcpy(j->s + j->n, t, len);
        j->n += len;
    }
}

static void jkey(struct json *j, const char *key)
{
    jraw(j, j->n ? ",\"" : "{\"");
    jraw(j, key);
    jraw(j, "\":");
}

static void jint(struct json *j, const char *key, long long v)
{
    char num[32];
    snprintf(num, sizeof num, "%lld", v);
    jkey(j, key);
    jraw(j, num);
}

static void jstr(struct json *j, const char *key, const char *v)
{
    jkey(j, key);
    jraw(j, "\"");
    /* room is kept for the closing quote and the rest of the record: a long value is cut */
    for (const unsigned char *p = (const unsigned char *)v; *p && j->n < sizeof j->s - 256; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\', esc[1] = (char)*p, esc[2] = 0;
        } else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
        } else {
            esc[0] = (char)*p, esc[1] = 0;
        }
        jraw(j, esc);
    }
    jraw(j, "\"");
}

/* Bytes of p[0..n) written to fd: n, or fewer with errno set (ENOSPC, EIO...). */
static size_t write_some(int fd, const char *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            break;
        done += (size_t)w;
    }
    return done;
}

static int write_all(int fd, const char *p, size_t n)
{
    return write_some(fd, p, n) == n ? 0 : -1;
}

static const char *const record_names[2] = {"started", "exit"};

/* NAME.tmp with RECORD_SIZE bytes written: the space of its record is the file's from now on,
 * whatever fills the disk later. No fsync: the write itself takes the space (allocated, or
 * reserved by delayed allocation, as on ext4, xfs and tmpfs), and overwriting it in place
 * needs none; an fsync here would cost every start two disk flushes. One already there with
 * RECORD_SIZE bytes (a spare run directory's, made beforehand) is taken as it is: no inode
 * and no block is allocated on the start's path. 0, or -1, errno set. */
static int reserve_record(int which)
{
    static char padding[RECORD_SIZE];
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s.tmp", record_names[which]);
    int fd = openat(task_fd, tmp, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == RECORD_SIZE) {
        reserved_fd[which] = fd;
        return 0;
    }
    if (fd >= 0)
        close(fd);
    memset(padding, ' ', sizeof padding);
    fd = openat(task_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (fd < 0)
        return -1;
    if (write_all(fd, padding, sizeof padding) < 0) {
        int err = errno;
        /* ours, just made: no half reservation stays behind to be mistaken for one */
        if (ftruncate(fd, 0) < 0 || unlinkat(task_fd, tmp, 0) < 0)
            note("give back %s: %s", tmp, strerror(errno));
        close(fd);
        errno = err;
        return -1;
    }
    reserved_fd[which] = fd;
    return 0;
}

/* NAME in TASKDIR, whole or not at all; 0, or -1 with errno set and a note written. Into
 * its reserved file when there is one (pwrite over blocks already allocated, then the file
 * cut to the record's length: neither needs free space), else into a new NAME.tmp.
 *
 * `exit` is fsynced before its rename and the directory after it: the workload's end must
 * outlive a power loss until the agent has committed it, whole (never torn: a reader would
 * take a torn one for corruption). `started` is flushed by neither: it is for the agent
 * alive (kill -9 included: the page cache keeps it), every process it names is gone after
 * a reboot, and the agent's own Running commit (synchronous) follows it within
 * milliseconds. What a power loss in between can leave is no `started`, or one that holds
 * only the reservation's filler (spaces, or the zeros of blocks never written): a reader
 * takes either for a record not written, which is a start that never reported (rolled
 * back and started again), as one cut between the exec and this record already is. A
 * record is one write into the file's first block, so it is not found half written. One
 * flush fewer for every start, and a burst's starts no longer wait for the disk. */
static int write_record(const char *name, struct json *j)
{
    int which = !strcmp(name, record_names[0]) ? 0 : 1;
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s.tmp", name);
    jraw(j, "}\n");
    const char *step = "open", *what = tmp;
    int fd = reserved_fd[which], made = fd < 0;
    reserved_fd[which] = -1;
    errno = 0;  /* a short pwrite sets none */
    if (fd >= 0) {
        step = "write";
        if (pwrite(fd, j->s, j->n, 0) != (ssize_t)j->n
            || (step = "cut", ftruncate(fd, (off_t)j->n) < 0))
            goto failed;
    } else {
        fd = openat(task_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
        if (fd < 0 || (step = "write", write_all(fd, j->s, j->n) < 0))
            goto failed;
    }
    if ((step = "fsync", which == 0 || fsync(fd) == 0)) {  /* `started`: none (above) */
        close(fd);
        fd = -1;
        step = "rename to", what = name;
        if (renameat(task_fd, tmp, task_fd, name) == 0
            && (step = "fsync the directory after", which == 0 || fsync(task_fd) == 0))
            return 0;
    }
failed:;
    int err = errno ? errno : EIO;
    if (fd >= 0)
        close(fd);
    if (made && fd >= 0 && unlinkat(task_fd, tmp, 0) < 0)  /* made here, and of no use */
        note("remove %s: %s", tmp, strerror(errno));
    note("%s %s: %s", step, what, strerror(err));
    errno = err;
    return -1;
}

static void reap_blocking(siginfo_t *si)
{
    memset(si, 0, sizeof *si);
    while (waitid(P_PID, (id_t)child_pid, si, WEXITED) < 0 && errno == EINTR)
        ;
    child_pid = -1;
}

/* The end of everything that cannot go on: a workload still running is killed (it would run
 * unsupervised, its end unrecorded), and `exit` says why. */
__attribute__((noreturn, format(printf, 3, 4)))
static void die(const char *stage, int err, const char *fmt, ...)
{
    static char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    note("%s", msg);
    if (child_pid > 0) {
        siginfo_t si;
        if (child_pidfd < 0 || syscall(SYS_pidfd_send_signal, child_pidfd, SIGKILL, NULL, 0) < 0)
            kill(child_pid, SIGKILL);  /* not reaped yet: the pid is still ours */
        reap_blocking(&si);
    }
    struct json j = {.n = 0};
    jstr(&j, "error", stage);
    jint(&j, "errno", err);
    jstr(&j, "message", msg);
    /* no record in TASKDIR (none open, or none written): the record on stdout, the agent's
     * pipe until `started` */
    if (task_fd >= 0 && write_record("exit", &j) == 0)  /* (which closes the record) */
        exit(1);
    if (task_fd < 0)
        jraw(&j, "}\n");
    write_all(STDOUT_FILENO, j.s, j.n);
    exit(1);
}

/* `dir` and its parent, each made when missing; with `spare` (a spare run directory, whose
 * SPARE_ATTEMPT holds the reserved records) the parent is that directory renamed, where the
 * parent is missing and `dir` is its SPARE_ATTEMPT: made beforehand, it costs the start no
 * inode. A spare that cannot be taken (gone, or the parent there already) is left alone. */
static int make_dir(const char *dir, const char *spare)
{
    char parent[PATH_MAX];
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t end = n;
    while (n > 0 && dir[n - 1] != '/')
        n--;
    if (n > 1 && n < sizeof parent) {
        memcpy(parent, dir, n - 1);
        parent[n - 1] = '\0';
        int first = end - n == strlen(SPARE_ATTEMPT) && !strncmp(dir + n, SPARE_ATTEMPT, end - n);
        if (spare && first && renameat2(AT_FDCWD, spare, AT_FDCWD, parent, RENAME_NOREPLACE) == 0)
            return 0;
        if (mkdir(parent, 0750) < 0 && errno != EEXIST)
            return -1;
    }
    return mkdir(dir, 0750) < 0 && errno != EEXIST ? -1 : 0;
}

__attribute__((noreturn))
static void usage(const char *why)
{
    fprintf(stderr,
            "xhagent-shim: %s\nusage: xhagent-shim --dir TASKDIR --cgroup CGROUPDIR "
            "[--log-cap BYTES] [--keep-free BYTES] [--cwd DIR] [--uid N --gid N] "
            "[--oom-score-adj N] "
            "[--method clone3|fork] [--spare SPAREDIR] "
            "-- PROG [ARGS...]\n",
            why);
    exit(2);
}

static unsigned long long number(const char *opt, const char *s, unsigned long long max)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *s == '-' || *end || errno || v > max) {
        static char why[256];
        snprintf(why, sizeof why, "%s: not a number from 0 to %llu: %.64s", opt, max, s);
        usage(why);
    }
    return v;
}

/* ---- clocks and /proc ----------------------------------------------------------------- */

static long long now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* /proc/PID/stat ("self" for PID 0), NUL-terminated in buf; 0, or -1. */
static int read_stat(pid_t pid, char *buf, size_t size)
{
    char path[64];
    if (pid)
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return 0;
}

/* Field 22 (start time), or -1. The command (field 2) may hold spaces and parentheses:
 * fields are counted from its last ')'. */
static long long start_time(pid_t pid)
{
    char buf[1024];
    if (read_stat(pid, buf, sizeof buf) < 0)
        return -1;
    char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoll(p + 1, NULL, 10) : -1;
}

/* Field 2 (the command name, at most 15 bytes) into out; 0, or -1. */
static int comm_of(pid_t pid, char *out, size_t size)
{
    char buf[1024];
    if (read_stat(pid, buf, sizeof buf) < 0)
        return -1;
    char *a = strchr(buf, '('), *b = strrchr(buf, ')');
    if (!a || !b || b < a)
        return -1;
    snprintf(out, size, "%.*s", (int)(b - a - 1), a + 1);
    return 0;
}

/* After the report pipe closed empty: 1 when the child exec'd, 0 when it died before (killed
 * at birth: some kernels, this one among them, SIGKILL every clone3(CLONE_INTO_CGROUP) child
 * of a group that was once cgroup.kill'd). The pipe closes at the exec and at an exit alike;
 * the name tells them apart once either is complete: the exec renames the child, and a death
 * leaves a zombie with the shim's name. */
static int exec_confirmed(pid_t pid, const char *prog)
{
    char own[64], its[64];
    const char *base = strrchr(prog, '/');
    base = base ? base + 1 : prog;
    if (comm_of(0, own, sizeof own) < 0 || !strncmp(base, own, 15))
        return 1;  /* cannot tell: the exit record will say what happened */
    for (int i = 0; i < 2000; i++) {  /* both states are microseconds away; 1 s at most */
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (comm_of(pid, its, sizeof its) < 0 || strcmp(its, own))
            return 1;
        if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid)
            return 0;
        usleep(500);
    }
    return 1;
}

/* 0 when cgroup.events says `populated 0`, 1 otherwise (also when it cannot be read). */
static int populated(int events_fd)
{
    char buf[256];
    if (events_fd < 0 || lseek(events_fd, 0, SEEK_SET) < 0)
        return 1;
    ssize_t n = read(events_fd, buf, sizeof buf - 1);
    if (n <= 0)
        return 1;
    buf[n] = 0;
    char *p = strstr(buf, "populated ");
    return !(p && (p == buf || p[-1] == '\n') && p[10] == '0');
}

/* ---- output --------------------------------------------------------------------------- */

/* A stream's file is made at its first byte, not before: a workload that writes nothing
 * (most short ones) costs its directory two inodes fewer. One already there when the shim
 * starts is opened now and appended to (it counts against the cap). One made later must be
 * the shim's own: O_EXCL, so a name planted meanwhile (a link to another file, by a workload
 * that can write here) is never written through; its output is dropped instead (EEXIST). */
static void sink_open(struct sink *s, const char *name, const char *times_name, int in,
                      unsigned long long cap, unsigned long long keep_free)
{
    struct stat st;
    s->name = name;
    s->times_name = times_name;
    s->times = -1;
    s->last_sec = -1;
    s->in = in;
    s->cap = cap;
    s->keep_free = keep_free;
    s->out = -1;
    s->times = openat(task_fd, times_name, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
    if (s->times >= 0 && fstat(s->times, &st) == 0 && S_ISREG(st.st_mode)) {
        s->marks = (unsigned long long)st.st_size / 16;  /* appended to, as the stream is */
    } else if (s->times >= 0 || errno != ENOENT) {
        if (s->times >= 0)
            close(s->times);
        s->times = -1;
        s->times_stopped = 1;  /* not a file to write through: `--since` starts earlier */
    }
    if (fstatat(task_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno != ENOENT)
            die("log", errno, "stat %s: %s", name, strerror(errno));
        return;  /* made by sink_create */
    }
    s->out = openat(task_fd, name, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
    if (s->out < 0)
        die("log", errno, "open %s: %s", name, strerror(errno));
    if (fstat(s->out, &st) < 0)
        die("log", errno, "fstat %s: %s", name, strerror(errno));
    s->size = (unsigned long long)st.st_size;  /* a file already there counts against the cap */
}

/* 0 once the stream has its file; -1 (s->write_errno set, the reason noted) if not. */
static int sink_create(struct sink *s)
{
    if (s->out >= 0)
        return 0;
    s->out = openat(task_fd, s->name, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC
                    | O_NOFOLLOW, 0640);
    if (s->out >= 0)
        return 0;
    s->write_errno = errno;
    note("create %s: %s (its output is dropped)", s->name, strerror(errno));
    return -1;
}

/* Bytes the output may still take from its filesystem, leaving keep_free there; all it wants
 * when that cannot be told. */
static unsigned long long room_for_output(const struct sink *s)
{
    struct statvfs st;
    if (fstatvfs(task_fd, &st) < 0)
        return ~0ULL;
    unsigned long long avail = (unsigned long long)st.f_bavail * st.f_frsize;
    return avail > s->keep_free ? avail - s->keep_free : 0;
}

/* Before the bytes at s->size are written, when they are the first of a new second: a mark
 * (the wall time now, their offset) in the stream's time index, so that `logs --since` finds
 * where a time's output begins. The mark goes first, so every byte in the stream has its
 * mark: output with no mark of its own was written in the second of the mark before it. Like
 * the stream, the index is made O_EXCL at its first mark; a failure stops the marks (the
 * agent then starts `--since` earlier, never later, than asked). */
static void mark_time(struct sink *s)
{
    struct timespec now;
    if (s->times_stopped || clock_gettime(CLOCK_REALTIME, &now) < 0 || now.tv_sec == s->last_sec)
        return;
    s->last_sec = now.tv_sec;
    if (s->keep_free && room_for_output(s) < 2 * sizeof(uint64_t)) {
        s->times_stopped = 1;  /* the last keep_free bytes are the agent's, as for output */
        note("%s: the last %llu bytes of the disk are the agent's (no more marks)",
             s->times_name, s->keep_free);
        return;
    }
    if (s->marks >= TIMES_MAX) {
        s->times_stopped = 1;
        note("%s: %d marks, the most kept (--since before its last mark starts there)",
             s->times_name, TIMES_MAX);
        return;
    }
    if (s->times < 0)
        s->times = openat(task_fd, s->times_name, O_WRONLY | O_CREAT | O_EXCL | O_APPEND
                          | O_CLOEXEC | O_NOFOLLOW, 0640);
    uint64_t mark[2] = {htole64((uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec),
                        htole64(s->size)};
    if (s->times < 0 || write_some(s->times, (const char *)mark, sizeof mark) != sizeof mark) {
        s->times_stopped = 1;
        note("write %s: %s (no more marks for --since)", s->times_name, strerror(errno));
        return;
    }
    s->marks++;
}

/* One read from the pipe into the file: 1 when data came, 0 when there is none now (or EOF,
 * after which s->in is -1). Beyond the cap, data is still read, so the writer never blocks. */
static int pump(struct sink *s)
{
    if (s->in < 0)
        return 0;
    ssize_t n = read(s->in, iobuf, sizeof iobuf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    if (n <= 0) {
        if (n < 0)
            note("read the workload's %s: %s", s->name, strerror(errno));
        close(s->in);
        s->in = -1;
        return 0;
    }
    unsigned long long keep = s->size >= s->cap ? 0 : s->cap - s->size;
    if (keep > (unsigned long long)n)
        keep = (unsigned long long)n;
    if (s->write_errno)
        keep = 0;
    if (keep && s->keep_free) {
        unsigned long long room = room_for_output(s);
        if (room < keep) {  /* written up to the floor; the rest, and all after it, dropped */
            keep = room;
            s->write_errno = ENOSPC;
            note("write %s: the last %llu bytes of the disk are the agent's (further output "
                 "is dropped)", s->name, s->keep_free);
        }
    }
    if (keep && sink_create(s) < 0)
        keep = 0;
    if (keep) {
        mark_time(s);
        size_t done = write_some(s->out, iobuf, keep);
        if (done < keep) {  /* the part not written is counted as dropped, and all after it */
            if (!s->write_errno) {
                s->write_errno = errno;
                note("write %s: %s (further output is dropped)", s->name, strerror(errno));
            }
            keep = done;
        }
    }
    s->size += keep;
    s->dropped += (unsigned long long)n - keep;
    return 1;
}

static void pump_final(struct sink *s)
{
    for (int i = 0; i < FINAL_READS && pump(s); i++)
        ;
    if (s->in >= 0)
        close(s->in);
    s->in = -1;
}

/* ---- signals -------------------------------------------------------------------------- */

/* SIGTERM goes on to the workload; SIGHUP and SIGINT are read and dropped. They are blocked
 * rather than ignored because an ignored signal stays ignored across exec, and the workload
 * must get the default dispositions. SIGCHLD wakes the loop where there is no pidfd. */
static int signals_setup(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
        die("signals", errno, "sigprocmask: %s", strerror(errno));
    /* spawn_glue puts SIGPIPE back to its default in the child */
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR)
        die("signals", errno, "ignore SIGPIPE: %s", strerror(errno));
    int fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd < 0)
        die("signals", errno, "signalfd: %s", strerror(errno));
    return fd;
}

static void signals_read(int fd)
{
    struct signalfd_siginfo si;
    while (read(fd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo != SIGTERM || child_pid < 0)
            continue;
        if (child_pidfd >= 0
                ? syscall(SYS_pidfd_send_signal, child_pidfd, SIGTERM, NULL, 0) < 0
                : kill(child_pid, SIGTERM) < 0)
            if (errno != ESRCH)
                note("forward SIGTERM to %d: %s", (int)child_pid, strerror(errno));
    }
}

/* One poll of the workload's output pipes, the signal fd and `fd` for `events` (the
 * child's pidfd while it runs, cgroup.events while its output drains), serving the pipes
 * and signals that are ready: the supervising loop and the drain wait on the same set.
 * Returns -1 when a signal interrupted the poll (nothing served), else 0; any other poll
 * failure ends the shim. */
static int serve_once(struct sink *out, struct sink *err, int fd, short events, int sig_fd,
                      int timeout_ms)
{
    struct pollfd p[4] = {
        {out->in, POLLIN, 0}, {err->in, POLLIN, 0}, {fd, events, 0}, {sig_fd, POLLIN, 0},
    };
    if (poll(p, 4, timeout_ms) < 0) {
        if (errno == EINTR)
            return -1;
        die("poll", errno, "poll: %s", strerror(errno));
    }
    if (p[0].revents)
        pump(out);
    if (p[1].revents)
        pump(err);
    if (p[3].revents)
        signals_read(sig_fd);
    return 0;
}

/* ---- start ---------------------------------------------------------------------------- */

static const char *const stage_names[] = {
    [XH_STAGE_JOIN] = "join", [XH_STAGE_FDS] = "fds",         [XH_STAGE_CWD] = "cwd",
    [XH_STAGE_SESSION] = "session", [XH_STAGE_SIGNALS] = "signals", [XH_STAGE_EXEC] = "exec",
    [XH_STAGE_IDS] = "ids", [XH_STAGE_OOM] = "oom_score_adj",
};

/* PROG as execvp finds it: itself when it names a path, else each directory of PATH. */
static const char **candidates(const char *prog)
{
    static const char *single[2];
    if (strchr(prog, '/')) {
        single[0] = prog;
        return single;
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/bin:/usr/bin";  /* glibc's execvp default */
    size_t count = 2;
    for (const char *p = path; *p; p++)
        count += *p == ':';
    const char **list = calloc(count, sizeof *list);
    if (!list)
        die("start", errno, "exec %s: %s", prog, strerror(errno));
    size_t i = 0;
    for (const char *p = path;; p++) {
        const char *end = strchrnul(p, ':');
        char *full;
        int len = (int)(end - p);
        if (asprintf(&full, "%.*s%s%s", len, p, len ? "/" : "", prog) < 0)
            die("start", ENOMEM, "exec %s: %s", prog, strerror(ENOMEM));
        list[i++] = full;
        if (!*end)
            break;
        p = end;
    }
    return list;
}

int shim_main(int argc, char **argv)
{
    const char *dir = NULL, *cgroup = NULL, *cwd = NULL, *method = NULL, *spare = NULL;
    unsigned long long cap = DEFAULT_LOG_CAP, keep_free = 0;
    long long uid = -1, gid = -1, oom_score_adj = OOM_AS_IS;
    int i;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--"))
            break;
        if (i + 1 >= argc)
            usage(a[0] == '-' ? "an option without its value" : "no `--` before the command");
        const char *v = argv[++i];
        if (!strcmp(a, "--dir"))
            dir = v;
        else if (!strcmp(a, "--cgroup"))
            cgroup = v;
        else if (!strcmp(a, "--cwd"))
            cwd = v;
        else if (!strcmp(a, "--spare"))
            spare = v;
        else if (!strcmp(a, "--log-cap"))
            cap = number(a, v, ~0ULL);
        else if (!strcmp(a, "--keep-free"))
            keep_free = number(a, v, ~0ULL);
        else if (!strcmp(a, "--uid"))
            uid = (long long)number(a, v, UINT32_MAX - 1);
        else if (!strcmp(a, "--gid"))
            gid = (long long)number(a, v, UINT32_MAX - 1);
        else if (!strcmp(a, "--method"))
            method = v;
        else if (!strcmp(a, "--oom-score-adj"))  /* -1000..1000 as `-N`, or N */
            oom_score_adj = v[0] == '-' ? -(long long)number(a, v + 1, 1000)
                                        : (long long)number(a, v, 1000);
        else
            usage("unknown option");
    }
    if (i >= argc - 1)
        usage("no command after `--`");
    if (!dir || !cgroup)
        usage("--dir and --cgroup are required");
    if ((uid < 0) != (gid < 0))
        usage("--uid and --gid go together");
    if (method && strcmp(method, "clone3") && strcmp(method, "fork"))
        usage("--method is clone3 or fork");
    char **cmd = argv + i + 1;

    if (make_dir(dir, spare) < 0)
        die("record", errno, "mkdir %s: %s", dir, strerror(errno));
    task_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (task_fd < 0)
        die("record", errno, "open %s: %s", dir, strerror(errno));
    for (int which = 0; which < 2; which++)
        if (reserve_record(which) < 0)
            die("reserve", errno, "reserve %s/%s.tmp: %s", dir, record_names[which],
                strerror(errno));
    int sig_fd = signals_setup();

    int cg_fd = open(cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cg_fd < 0)
        die("cgroup", errno, "open %s: %s", cgroup, strerror(errno));
    int use_clone3 = method ? method[0] == 'c' : xh_clone3_cgroup_probe() == 0;
    int procs_fd = -1;
    if (!use_clone3 && (procs_fd = openat(cg_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC)) < 0)
        die("cgroup", errno, "open %s/cgroup.procs: %s", cgroup, strerror(errno));
    int events_fd = openat(cg_fd, "cgroup.events", O_RDONLY | O_CLOEXEC);  /* -1: grace only */

    int out_pipe[2], err_pipe[2], report[2];
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd < 0)
        die("start", errno, "open /dev/null: %s", strerror(errno));
    if (pipe2(out_pipe, O_CLOEXEC) < 0 || pipe2(err_pipe, O_CLOEXEC) < 0
        || pipe2(report, O_CLOEXEC) < 0)
        die("start", errno, "pipe: %s", strerror(errno));
    struct sink out = {0}, err = {0};
    sink_open(&out, "stdout", "stdout.times", out_pipe[0], cap, keep_free);
    sink_open(&err, "stderr", "stderr.times", err_pipe[0], cap, keep_free);

    struct xh_spawn_req req = {
        .use_clone3 = use_clone3,
        .cgroup_fd = use_clone3 ? cg_fd : -1,
        .procs_fd = procs_fd,
        .err_fd = report[1],
        .paths = candidates(cmd[0]),
        .argv = cmd,
        .envp = environ,
        .cwd = cwd,
        .stdio = {null_fd, out_pipe[1], err_pipe[1]},
        .keep = NULL,
        .nkeep = 0,
        .new_session = 1,  /* its own process group: signals to the shim's group miss it */
        .mask = NULL,
        .nmask = 0,
        .set_ids = uid >= 0,
        .reset_ignored = 1, /* whatever ignored what in the agent's world, the workload starts clean */
        .uid = (uint32_t)(uid < 0 ? 0 : uid),
        .gid = (uint32_t)(gid < 0 ? 0 : gid),
        .set_oom_score_adj = oom_score_adj != OOM_AS_IS,
        .oom_score_adj = (int32_t)(oom_score_adj == OOM_AS_IS ? 0 : oom_score_adj),
    };
    int32_t pidfd = -1;
    int32_t pid = xh_spawn(&req, &pidfd);
    const char *how = use_clone3 ? "clone3" : "fork";
    if (pid < 0)
        die(how, -pid, "%s into %s: %s", how, cgroup, strerror(-pid));
    child_pid = pid;
    child_pidfd = pidfd;
    close(out_pipe[1]);
    close(err_pipe[1]);
    close(report[1]);
    close(null_fd);
    close(cg_fd);
    if (procs_fd >= 0)
        close(procs_fd);

    /* The report pipe closes at the exec, or brings the step that failed. (A frozen group
     * holds the child before its exec, and us here, until it is thawed.) */
    struct xh_spawn_err failed;
    ssize_t n;
    while ((n = read(report[0], &failed, sizeof failed)) < 0 && errno == EINTR)
        ;
    close(report[0]);
    if (n != 0) {
        siginfo_t si;
        reap_blocking(&si);
        if (n != (ssize_t)sizeof failed)
            die("start", n < 0 ? errno : EIO, "start %s: the child's report was cut short", cmd[0]);
        int e = failed.err;
        const char *stage = failed.stage > 0 && failed.stage <= XH_STAGE_OOM
                                ? stage_names[failed.stage] : "start";
        switch (failed.stage) {
        case XH_STAGE_EXEC:
            die(stage, e, "exec %s: %s", cmd[0], strerror(e));
        case XH_STAGE_CWD:
            die(stage, e, "cwd %s: %s", cwd, strerror(e));
        case XH_STAGE_JOIN:
            die(stage, e, "join %s/cgroup.procs: %s", cgroup, strerror(e));
        case XH_STAGE_IDS:
            die(stage, e, "ids uid %lld gid %lld: %s", uid, gid, strerror(e));
        case XH_STAGE_OOM:
            die(stage, e, "oom_score_adj %lld: %s", oom_score_adj, strerror(e));
        default:
            die(stage, e, "%s %s: %s", stage, cmd[0], strerror(e));
        }
    }
    if (!exec_confirmed(child_pid, cmd[0])) {
        siginfo_t si;
        reap_blocking(&si);
        int sig = si.si_code == CLD_EXITED ? 0 : si.si_status;
        die(how, ECANCELED, "%s into %s: %s was killed by signal %d before its exec%s", how, cgroup,
            cmd[0], sig,
            use_clone3 && sig == SIGKILL
                ? " (some kernels kill every clone3 child of a group that was once cgroup.kill'd:"
                  " start in a fresh leaf, or with --method fork)"
                : "");
    }
    /* the agent's directory is not held busy for the workload's lifetime */
    if (chdir("/") < 0)
        note("chdir /: %s", strerror(errno));
    if (child_pidfd < 0)  /* the fork way: no pidfd from clone; SIGCHLD serves where this fails */
        child_pidfd = (int)syscall(SYS_pidfd_open, child_pid, 0);
    if (fcntl(out.in, F_SETFL, O_NONBLOCK) < 0 || fcntl(err.in, F_SETFL, O_NONBLOCK) < 0)
        die("start", errno, "pipe: %s", strerror(errno));

    struct json j = {.n = 0};
    jint(&j, "shim_pid", getpid());
    jint(&j, "shim_start_time", start_time(0));
    jint(&j, "pid", child_pid);
    jint(&j, "start_time", start_time(child_pid));  /* unreaped: /proc/PID is there */
    jstr(&j, "spawn_method", how);
    jint(&j, "started_ns", now_ns(CLOCK_REALTIME));
    if (write_record("started", &j) < 0)
        die("record", errno, "write %s/started: %s", dir, strerror(errno));
    /* Our stdout may be the agent's pipe: closing it tells the agent the record is there
     * (at once, where polling the directory would cost it a sleep per start). */
    int quiet = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (quiet < 0 || dup2(quiet, STDOUT_FILENO) < 0)
        close(STDOUT_FILENO);
    if (quiet > STDOUT_FILENO)
        close(quiet);

    /* Supervise: output, the workload's end, signals, all in one poll. */
    siginfo_t si;
    memset(&si, 0, sizeof si);
    while (child_pid > 0) {
        if (serve_once(&out, &err, child_pidfd, POLLIN, sig_fd, -1) < 0)
            continue;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)child_pid, &si, WEXITED | WNOHANG) < 0 && errno != EINTR)
            die("wait", errno, "waitid %d: %s", (int)child_pid, strerror(errno));
        if (si.si_pid == child_pid)
            child_pid = -1;
    }
    long long ended = now_ns(CLOCK_REALTIME);
    if (child_pidfd >= 0)
        close(child_pidfd);
    child_pidfd = -1;

    /* Drain: to EOF, unless the output is held open by processes that outlive the workload;
     * an empty group means no writer is left there, and the grace bounds the rest. */
    long long deadline = now_ns(CLOCK_MONOTONIC) + DRAIN_GRACE_MS * 1000000LL;
    while (out.in >= 0 || err.in >= 0) {
        long long left_ms = (deadline - now_ns(CLOCK_MONOTONIC)) / 1000000LL;
        if (left_ms <= 0 || !populated(events_fd))
            break;
        serve_once(&out, &err, events_fd, POLLPRI, sig_fd, (int)left_ms);  /* EINTR: look again */
    }
    pump_final(&out);
    pump_final(&err);
    /* The output on the disk before the end is recorded; a stream that holds nothing has
     * nothing to flush (its directory entry goes to the disk with the `exit` record's). */
    if ((out.size && out.out >= 0 && fsync(out.out) < 0)
            || (err.size && err.out >= 0 && fsync(err.out) < 0))
        note("fsync the output: %s", strerror(errno));

    j.n = 0;
    if (si.si_code == CLD_EXITED) {
        jint(&j, "exit_code", si.si_status);
    } else {
        jint(&j, "signal", si.si_status);
        jraw(&j, si.si_code == CLD_DUMPED ? ",\"core_dumped\":true" : ",\"core_dumped\":false");
    }
    jint(&j, "ended_ns", ended);
    jint(&j, "stdout_dropped", (long long)out.dropped);
    jint(&j, "stderr_dropped", (long long)err.dropped);
    if (out.write_errno || err.write_errno)  /* why output was dropped below the cap */
        jint(&j, "output_errno", out.write_errno ? out.write_errno : err.write_errno);
    if (write_record("exit", &j) < 0)
        return 1;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--serve"))
        return shim_serve(argc, argv);
    if (argc >= 3 && !strcmp(argv[1], "--serve-at"))
        return shim_serve_at(argc, argv);
    if (argc >= 3 && !strcmp(argv[1], "--make-spares"))
        return shim_make_spares(argc, argv);
    return shim_main(argc, argv);
}
