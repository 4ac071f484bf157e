/* spawn_glue.c: start a process that is inside a cgroup v2 group before it runs anything.
 *
 * clone3(CLONE_INTO_CGROUP) (Linux 5.7+) creates the child in the group; elsewhere the child,
 * a plain fork, writes "0" (itself) into the group's cgroup.procs before anything else. Either
 * way the child then sets up its fds, cwd, session and signals and execs; a step that fails
 * writes {stage, errno} into a CLOEXEC pipe and exits 127, so the parent reads nothing when the
 * exec succeeded. Python code cannot run in such a child: it is a raw copy of one thread, so
 * only system calls run there until the exec.
 *
 * With share_vm (the clone3 way, on x86_64) the child shares the caller's memory until the exec
 * (CLONE_VM | CLONE_VFORK, as posix_spawn does) on a stack of its own: a copy of the agent's
 * page tables cost 1.8 ms a start at 23 MB resident and 3.0 ms at 80 MB on this project's
 * host, and made every page the agent wrote afterwards fault once. The calling thread sleeps
 * until the exec (so not for a group that is frozen: the child would wait there, and it with
 * it); the others run on, so the child touches no memory but its stack, and sets its ids with
 * the kernel's own calls: glibc's setuid would signal the threads it believes this process has.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "spawn_glue.h"

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef CLONE_VM
#define CLONE_VM 0x00000100
#endif
#ifndef CLONE_VFORK
#define CLONE_VFORK 0x00004000
#endif
#define XH_CHILD_STACK (256 * 1024)
#define XH_CLONE_INTO_CGROUP 0x200000000ULL
#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

struct xh_clone_args {  /* struct clone_args, CLONE_ARGS_SIZE_VER2 (88 bytes) */
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
    uint64_t set_tid, set_tid_size, cgroup;
};

int32_t xh_clone3_cgroup_probe(void)
{
    /* A cgroup fd above INT_MAX is refused with EINVAL by every kernel that knows the flag,
     * before any process is made; older ones refuse the larger struct (E2BIG) or clone3 itself. */
    struct xh_clone_args a;
    memset(&a, 0, sizeof a);
    a.flags = XH_CLONE_INTO_CGROUP;
    a.cgroup = (uint64_t)INT_MAX + 1;
    long r = syscall(SYS_clone3, &a, sizeof a);
    if (r == 0)
        _exit(127);  /* never: the kernel created a child from an invalid request */
    if (r > 0)
        return EPROTO;
    return errno == EINVAL ? 0 : errno;
}

/* The kernel's struct sigaction (x86_64 and arm64 alike: both have sa_restorer). */
struct xh_ksigaction {
    void (*handler)(int);
    unsigned long flags;
    void (*restorer)(void);
    uint64_t mask;
};

static int ksigaction(int sig, const struct xh_ksigaction *act, struct xh_ksigaction *old)
{
    return (int)syscall(SYS_rt_sigaction, sig, act, old, sizeof(uint64_t));
}

static void report(int fd, int stage, int err)
{
    struct xh_spawn_err e = {stage, err};
    ssize_t n;
    do {
        n = write(fd, &e, sizeof e);
    } while (n < 0 && errno == EINTR);
    _exit(127);
}

static int close_from(int lo, int hi)  /* close [lo, hi]; hi < 0: to the end */
{
    if (hi >= 0 && hi < lo)
        return 0;
    if (syscall(SYS_close_range, (unsigned)lo, hi < 0 ? ~0U : (unsigned)hi, 0) == 0)
        return 0;
    if (errno != ENOSYS && errno != EINVAL)
        return -1;
    struct rlimit rl;  /* before Linux 5.9: one close per possible fd */
    long top = hi >= 0 ? hi : (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                                ? (long)rl.rlim_cur - 1 : 65535);
    for (long fd = lo; fd <= top; fd++)
        close((int)fd);
    return 0;
}

static void child(const struct xh_spawn_req *r)
{
    int fd = r->err_fd;

    if (!r->use_clone3) {
        ssize_t n;
        do {
            n = write(r->procs_fd, "0", 1);  /* "0": the writing process itself */
        } while (n < 0 && errno == EINTR);
        if (n != 1)
            report(fd, XH_STAGE_JOIN, n < 0 ? errno : EIO);
    }

    /* stdio: a source among 0..2 that another target would overwrite is moved up first. */
    int src[3];
    for (int i = 0; i < 3; i++) {
        src[i] = r->stdio[i];
        if (src[i] >= 0 && src[i] < 3 && src[i] != i) {
            src[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3);
            if (src[i] < 0)
                report(fd, XH_STAGE_FDS, errno);
        }
    }
    /* ... and the error pipe must not be one of them either */
    if (fd < 3) {
        fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
            _exit(127);
    }
    for (int i = 0; i < 3; i++) {
        if (src[i] < 0)
            continue;
        if (src[i] == i) {
            if (fcntl(i, F_SETFD, 0) < 0)
                report(fd, XH_STAGE_FDS, errno);
        } else if (dup2(src[i], i) < 0) {
            report(fd, XH_STAGE_FDS, errno);
        }
    }
    /* every fd >= 3 is closed except the kept ones (made inheritable) and the error pipe */
    int lo = 3;
    for (int i = 0; i <= r->nkeep; i++) {
        int k = i < r->nkeep ? r->keep[i] : -1;
        if (k >= 0 && k < lo)
            continue;
        int hi = k < 0 ? -1 : k - 1;
        /* skip the error pipe inside this range */
        if (fd >= lo && (hi < 0 || fd <= hi)) {
            if (close_from(lo, fd - 1) < 0)
                report(fd, XH_STAGE_FDS, errno);
            lo = fd + 1;
        }
        if (close_from(lo, hi) < 0)
            report(fd, XH_STAGE_FDS, errno);
        if (k < 0)
            break;
        if (fcntl(k, F_SETFD, 0) < 0)
            report(fd, XH_STAGE_FDS, errno);
        lo = k + 1;
    }

    if (r->cwd && chdir(r->cwd) < 0)
        report(fd, XH_STAGE_CWD, errno);
    if (r->new_session && setsid() < 0)
        report(fd, XH_STAGE_SESSION, errno);

    /* The parent's handlers must not run here: each caught signal back to its default; and
     * SIGPIPE, SIGXFSZ, which the Python runtime ignores, too (as subprocess does). Other
     * ignored signals stay ignored (nohup), unless reset_ignored. The kernel's own call,
     * not glibc's: glibc refuses the signals it reserves (32, 33), which a library in the
     * parent may still have set to ignored, and a workload must not inherit that. Then the
     * mask asked for. */
    for (int s = 1; s < NSIG; s++) {
        struct xh_ksigaction sa;
        if (s == SIGKILL || s == SIGSTOP || ksigaction(s, NULL, &sa) < 0)
            continue;
        int ignored = sa.handler == SIG_IGN && !(sa.flags & SA_SIGINFO);
        int deflt = sa.handler == SIG_DFL && !(sa.flags & SA_SIGINFO);
        if (deflt || (ignored && !r->reset_ignored && s != SIGPIPE && s != SIGXFSZ))
            continue;
        memset(&sa, 0, sizeof sa);
        sa.handler = SIG_DFL;
        if (ksigaction(s, &sa, NULL) < 0)
            report(fd, XH_STAGE_SIGNALS, errno);
    }
    sigset_t mask;
    sigemptyset(&mask);
    for (int i = 0; i < r->nmask; i++)
        sigaddset(&mask, r->mask[i]);
    if (sigprocmask(SIG_SETMASK, &mask, NULL) < 0)
        report(fd, XH_STAGE_SIGNALS, errno);

    if (r->set_oom_score_adj) {  /* while /proc/self is still this uid's to write */
        char value[16], *p = value + sizeof value;  /* by hand: no stdio in this child */
        int v = r->oom_score_adj < 0 ? -r->oom_score_adj : r->oom_score_adj;
        do
            *--p = (char)('0' + v % 10);
        while ((v /= 10) && p > value + 1);
        if (r->oom_score_adj < 0)
            *--p = '-';
        ssize_t n = value + sizeof value - p;
        int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if (adj < 0)
            report(fd, XH_STAGE_OOM, errno);
        ssize_t put = write(adj, p, (size_t)n);
        if (put != n)
            report(fd, XH_STAGE_OOM, put < 0 ? errno : EIO);
        close(adj);
    }

    /* groups first: once the uid is dropped, setgroups/setgid are no longer allowed */
    if (r->set_ids && (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setgid, r->gid) < 0 ||
                       syscall(SYS_setuid, r->uid) < 0))
        report(fd, XH_STAGE_IDS, errno);

    /* the first error that is not "not here" is the one to report (as CPython's subprocess) */
    int saved = 0;
    for (int i = 0; r->paths[i]; i++) {
        execve(r->paths[i], r->argv, r->envp);
        if (errno != ENOENT && errno != ENOTDIR && saved == 0)
            saved = errno;
    }
    report(fd, XH_STAGE_EXEC, saved ? saved : errno);
}

#if defined(__x86_64__)
/* clone3 whose child runs fn(arg) on the stack the request names and never returns here: the
 * child's first instructions must not touch the caller's stack, which it shares. */
static long clone3_run(struct xh_clone_args *a, void (*fn)(const struct xh_spawn_req *),
                       const struct xh_spawn_req *arg)
{
    long ret;
    register void (*r12)(const struct xh_spawn_req *) __asm__("r12") = fn;
    register const struct xh_spawn_req *r13 __asm__("r13") = arg;
    __asm__ volatile(
        "syscall\n\t"
        "test %%rax, %%rax\n\t"
        "jnz 1f\n\t"
        "xor %%ebp, %%ebp\n\t" /* the child: the outermost frame of its own stack */
        "mov %%r13, %%rdi\n\t"
        "call *%%r12\n\t"
        "mov $60, %%eax\n\t" /* exit(127), should fn ever return */
        "mov $127, %%edi\n\t"
        "syscall\n\t"
        "hlt\n\t"
        "1:\n\t"
        : "=a"(ret)
        : "a"((long)SYS_clone3), "D"(a), "S"(sizeof *a), "r"(r12), "r"(r13)
        : "rcx", "r11", "memory");
    return ret;  /* the child's pid, or -errno */
}
#endif

/* The child of the clone3 way, which runs `child`: sharing the caller's memory on a stack of
 * its own when asked and possible, else a copy of it. Its pid, or -1 with errno. */
static long clone3_child(struct xh_clone_args *a, const struct xh_spawn_req *req)
{
#if defined(__x86_64__)
    if (req->share_vm) {
        void *stack = mmap(NULL, XH_CHILD_STACK, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (stack == MAP_FAILED)
            return -1;
        a->flags |= CLONE_VM | CLONE_VFORK;
        a->stack = (uint64_t)(uintptr_t)stack;
        a->stack_size = XH_CHILD_STACK;
        long pid = clone3_run(a, child, req);  /* back once the child has exec'd or exited */
        munmap(stack, XH_CHILD_STACK);
        if (pid < 0) {
            errno = (int)-pid;
            return -1;
        }
        return pid;
    }
#endif
    long pid = syscall(SYS_clone3, a, sizeof *a);
    if (pid == 0)
        child(req);  /* never returns */
    return pid;
}

int32_t xh_spawn(const struct xh_spawn_req *req, int32_t *pidfd)
{
    sigset_t all, old;
    long pid;
    int err = 0;

    *pidfd = -1;
    /* No signal handler may run in the child, and none of the caller's is lost: everything is
     * blocked across the clone, and the caller's mask is put back in the parent. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (req->use_clone3) {
        struct xh_clone_args a;
        int out = -1;
        memset(&a, 0, sizeof a);
        a.flags = XH_CLONE_INTO_CGROUP | CLONE_PIDFD;
        a.pidfd = (uint64_t)(uintptr_t)&out;
        a.exit_signal = SIGCHLD;
        a.cgroup = (uint64_t)req->cgroup_fd;
        pid = clone3_child(&a, req);
        if (pid > 0)
            *pidfd = out;
    } else {
        pid = syscall(SYS_clone, SIGCHLD, 0, NULL, NULL, 0);  /* fork(2) without the atfork hooks */
    }
    if (pid == 0)
        child(req);  /* never returns */
    if (pid < 0)
        err = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return pid < 0 ? -err : (int32_t)pid;
}
