/* shim_serve.c: `xhagent-shim --serve`, the agent's shim server.
 *
 * A one-shot shim costs the agent a process spawn and an exec of this program for every
 * workload, both on the agent's own thread. The server is exec'd once: its stdin is a
 * SOCK_SEQPACKET socket whose other end is the agent's, and each request on it makes one
 * supervisor by fork alone (this process is small, so the fork is cheap), which runs
 * exactly what a one-shot `xhagent-shim` with the request's command line would run: the
 * same records in TASKDIR, the same exit status, the workload its child. Each supervisor
 * is thus a process of its own, in its own session: it outlives this server and the agent,
 * and a restarted agent finds it by its `started` record as it finds a one-shot shim.
 *
 * Request, one message: u32 argc, then argc NUL-terminated arguments (the one-shot command
 * line without the program name), then the environment's NUL-terminated NAME=VALUE strings
 * to the end; with it, as SCM_RIGHTS, the write end of the agent's pipe, which becomes the
 * supervisor's stdout (the pipe a one-shot shim closes once `started` is written).
 * Reply, one message per request and in their order: struct shim_reply (the supervisor's
 * pid, or -1 and errno), with the supervisor's pidfd as SCM_RIGHTS where the kernel has
 * pidfd_open: the agent watches it for the supervisor's end, as it watches a one-shot
 * shim's. A request that cannot be read is answered with pid -1 and its errno (EMSGSIZE,
 * EBADMSG), and nothing is started.
 *
 * Supervisors are reaped here as they end (their status is in their records): a pidfd is
 * opened on a child not yet reaped, so it names that process and never a reuse of its pid.
 * The server ends when the agent's end closes; supervisors still running go on, reparented.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shim.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* The most a request holds: the agent sends larger command lines to a one-shot shim. */
#define REQUEST_MAX (60 << 10)

struct shim_reply {
    int32_t pid;
    int32_t err;
};

extern char **environ;

static void reply(int sock, int32_t pid, int32_t err, int fd)
{
    struct shim_reply r = {pid, err};
    struct iovec iov = {&r, sizeof r};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        msg.msg_control = u.buf;
        msg.msg_controllen = sizeof u.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    /* the agent gone: the next recvmsg sees its end closed */
    while (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR)
        ;
}

/* The request's strings: argv[0..argc) after a program name, then the environment, each
 * array NULL-ended (pointers into buf). 0, or -1 for a request that is not one. */
static int split(char *buf, size_t n, const char *program, char ***argv_out, char ***env_out)
{
    uint32_t argc;
    if (n <= sizeof argc || buf[n - 1] != '\0') {
        errno = EBADMSG;
        return -1;
    }
    memcpy(&argc, buf, sizeof argc);
    size_t strings = 0;
    for (size_t i = sizeof argc; i < n; i++)
        strings += buf[i] == '\0';
    if (argc == 0 || argc > strings) {
        errno = EBADMSG;
        return -1;
    }
    char **argv = calloc(argc + 2, sizeof *argv);
    char **env = calloc(strings - argc + 1, sizeof *env);
    if (!argv || !env) {
        free(argv);
        free(env);
        errno = ENOMEM;
        return -1;
    }
    argv[0] = (char *)program;
    char *p = buf + sizeof argc;
    for (size_t i = 0; i < strings; i++) {
        if (i < argc)
            argv[i + 1] = p;
        else
            env[i - argc] = p;
        p += strlen(p) + 1;
    }
    *argv_out = argv;
    *env_out = env;
    return (int)argc + 1;
}

/* Where this process's command line lies (/proc/PID/cmdline, what ps shows): the agent
 * starts the server with empty arguments after `--serve`, room that a supervisor overwrites
 * with its own command line, so that it reads as a one-shot shim's (`--dir` says which
 * task it serves). A longer one is cut at the room's end. */
static char *title;
static size_t title_room;

static void name_supervisor(int argc, char **argv)
{
    size_t used = 0;
    for (int i = 0; i < argc && used < title_room; i++) {
        size_t len = strlen(argv[i]) + 1;
        if (len > title_room - used)
            len = title_room - used;
        memmove(title + used, argv[i], len);
        used += len;
    }
    memset(title + used, 0, title_room - used);
    if (title_room)
        title[title_room - 1] = '\0';
}

/* In the new supervisor: a one-shot shim's start, with stdin /dev/null, stdout the
 * agent's pipe, stderr the server's, nothing else of the server's open. */
__attribute__((noreturn))
static void supervise(int ready, int argc, char **argv, char **env, int sock, int sig_fd)
{
    close(sock);  /* the server's end: the agent sees it close when the server ends */
    close(sig_fd);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);  /* as a one-shot shim starts: nothing blocked */
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd < 0 || dup2(null_fd, STDIN_FILENO) < 0 || dup2(ready, STDOUT_FILENO) < 0)
        _exit(1);  /* the pipe closes without a record: the agent reports the shim's end */
    if (null_fd > STDERR_FILENO)
        close(null_fd);
    if (ready > STDERR_FILENO)
        close(ready);
    if (setsid() < 0)
        _exit(1);
    environ = env;
    name_supervisor(argc, argv);
    exit(shim_main(argc, argv));
}

int shim_serve(int argc, char **argv)
{
    const char *program = strdup(argv[0]);  /* the room below is overwritten in supervisors */
    if (!program)
        return 1;
    title = argv[0];
    title_room = (size_t)(argv[argc - 1] + strlen(argv[argc - 1]) + 1 - argv[0]);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0)
        return 1;
    int sig_fd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    int sock = fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);  /* not inherited by supervisors */
    if (sig_fd < 0 || sock < 0)
        return 1;
    static char buf[REQUEST_MAX + 1];
    for (;;) {
        struct pollfd p[2] = {{sock, POLLIN, 0}, {sig_fd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            return 1;
        if (p[1].revents) {
            struct signalfd_siginfo si;
            while (read(sig_fd, &si, sizeof si) == (ssize_t)sizeof si)
                ;
            while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
        }
        if (!p[0].revents)
            continue;
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } u;
        struct iovec iov = {buf, REQUEST_MAX};
        struct msghdr msg = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf,
        };
        ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 ? 0 : 1;  /* the agent closed its end (or the socket failed) */
        int ready = -1;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS
                && c->cmsg_len == CMSG_LEN(sizeof(int)))
                memcpy(&ready, CMSG_DATA(c), sizeof ready);
        char **argv = NULL, **env = NULL;
        int argc = -1;
        if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
            errno = EMSGSIZE;
        else if (ready < 0)
            errno = EBADMSG;
        else
            argc = split(buf, (size_t)n, program, &argv, &env);
        if (argc < 0) {
            reply(sock, -1, errno, -1);
        } else {
            pid_t pid = fork();
            if (pid == 0)
                supervise(ready, argc, argv, env, sock, sig_fd);
            if (pid < 0) {
                reply(sock, -1, errno, -1);
            } else {
                int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);  /* -1 before Linux 5.3 */
                reply(sock, pid, 0, pidfd);
                if (pidfd >= 0)
                    close(pidfd);
            }
        }
        free(argv);
        free(env);
        if (ready >= 0)
            close(ready);
    }
}
