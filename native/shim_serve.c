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
 *
 * `xhagent-shim --serve-at PATH` is the same server as the main process of its own systemd
 * unit (xhagent-workloads.service), so that workloads are its descendants and not the
 * agent's, and so are bound by that unit's sandbox and not by the agent's tighter one. It
 * listens on a SOCK_SEQPACKET socket at PATH (mode 0600), takes connections only from its
 * own user (SO_PEERCRED), up to CONNS_MAX at once, and serves each as above; it says
 * READY=1 to systemd once it listens, and ends only by a signal. An agent restarted
 * connects again; the supervisors never depended on a connection.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shim.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* The most a request holds: the agent sends larger command lines to a one-shot shim. */
#define REQUEST_MAX (60 << 10)
/* Empty arguments `--serve-at` gives itself: room for the supervisors' command lines. */
#define TITLE_ROOM 4096

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

/* The server's descriptors: the signalfd, the listening socket (`--serve-at`; -1 for
 * `--serve`) and the agents' connections (`--serve`: stdin's socket alone). */
#define CONNS_MAX 8
struct server {
    const char *program;
    int sig_fd;
    int listen_fd;
    int conns[CONNS_MAX];
    int n_conns;
};

/* In the new supervisor: a one-shot shim's start, with stdin /dev/null, stdout the
 * agent's pipe, stderr the server's, nothing else of the server's open (an agent must see
 * its connection close when the server ends, whatever supervisors still run). */
__attribute__((noreturn))
static void supervise(int ready, int argc, char **argv, char **env, struct server *srv)
{
    for (int i = 0; i < srv->n_conns; i++)
        close(srv->conns[i]);
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    close(srv->sig_fd);
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

/* One request from `sock`, answered there. 0, or -1 once that agent's end is closed (or
 * the socket failed). */
static int take_request(struct server *srv, int sock)
{
    static char buf[REQUEST_MAX + 1];
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {buf, REQUEST_MAX};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf,
    };
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (n <= 0)
        return -1;
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
        argc = split(buf, (size_t)n, srv->program, &argv, &env);
    if (argc < 0) {
        reply(sock, -1, errno, -1);
    } else {
        pid_t pid = fork();
        if (pid == 0)
            supervise(ready, argc, argv, env, srv);
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
    return 0;
}

/* A connection to the listening socket, kept when its peer runs as this server's user
 * (root, for the packaged unit; the socket's directory is that user's alone besides). */
static void take_connection(struct server *srv)
{
    int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (srv->n_conns == CONNS_MAX
        || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0
        || cred.uid != geteuid()) {
        close(fd);
        return;
    }
    srv->conns[srv->n_conns++] = fd;
}

static int serve(struct server *srv)
{
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0)
        return 1;
    srv->sig_fd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    if (srv->sig_fd < 0)
        return 1;
    for (;;) {
        struct pollfd p[CONNS_MAX + 2];
        int n = 0;
        p[n++] = (struct pollfd){srv->sig_fd, POLLIN, 0};
        if (srv->listen_fd >= 0)
            p[n++] = (struct pollfd){srv->listen_fd, POLLIN, 0};
        int first = n;
        for (int i = 0; i < srv->n_conns; i++)
            p[n++] = (struct pollfd){srv->conns[i], POLLIN, 0};
        if (poll(p, (nfds_t)n, -1) < 0) {
            if (errno == EINTR)
                continue;
            return 1;
        }
        if (p[0].revents) {
            struct signalfd_siginfo si;
            while (read(srv->sig_fd, &si, sizeof si) == (ssize_t)sizeof si)
                ;
            while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
        }
        /* connections served in reverse, so that one closed is dropped by moving the
         * last into its place, among those already served */
        for (int i = srv->n_conns - 1; i >= 0; i--) {
            if (!p[first + i].revents || take_request(srv, srv->conns[i]) == 0)
                continue;
            close(srv->conns[i]);
            srv->conns[i] = srv->conns[--srv->n_conns];
        }
        if (srv->listen_fd < 0 && srv->n_conns == 0)
            return 0;  /* `--serve`: its agent closed its end */
        if (srv->listen_fd >= 0 && p[1].revents)
            take_connection(srv);
    }
}

/* The room for supervisors' command lines: from argv[0] to the end of the last argument. */
static int keep_title_room(int argc, char **argv)
{
    title = argv[0];
    title_room = (size_t)(argv[argc - 1] + strlen(argv[argc - 1]) + 1 - argv[0]);
    return 0;
}

int shim_serve(int argc, char **argv)
{
    struct server srv = {.program = strdup(argv[0]), .listen_fd = -1};
    if (!srv.program)  /* (copied: the room below is overwritten in supervisors) */
        return 1;
    keep_title_room(argc, argv);
    srv.conns[0] = fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);  /* not inherited by supervisors */
    if (srv.conns[0] < 0)
        return 1;
    srv.n_conns = 1;
    return serve(&srv);
}

/* systemd's readiness protocol (Type=notify): READY=1 on $NOTIFY_SOCKET, which is then
 * taken out of the environment (no supervisor has it: each gets the request's). */
static void notify_ready(void)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (!path || (path[0] != '/' && path[0] != '@') || strlen(path) >= sizeof addr.sun_path)
        return;
    memcpy(addr.sun_path, path, strlen(path));
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
    if (addr.sun_path[0] == '@')
        addr.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        sendto(fd, "READY=1", 7, MSG_NOSIGNAL, (struct sockaddr *)&addr, len);
        close(fd);
    }
    unsetenv("NOTIFY_SOCKET");
}

static int fail_at(const char *path, const char *what)
{
    fprintf(stderr, "xhagent-shim: --serve-at %s: %s: %s\n", path, what, strerror(errno));
    return 1;
}

int shim_serve_at(int argc, char **argv)
{
    const char *path = argv[2];
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (path[0] != '/' || strlen(path) >= sizeof addr.sun_path) {
        errno = EINVAL;
        return fail_at(path, "an absolute path shorter than 108 bytes");
    }
    if (argc == 3) {
        /* Started by its unit without room for the supervisors' command lines: made once
         * more with it (the same process, so the same main PID to systemd). */
        char **room = calloc(TITLE_ROOM + 4, sizeof *room);
        if (room) {
            room[0] = argv[0], room[1] = argv[1], room[2] = argv[2];
            for (int i = 3; i < TITLE_ROOM + 3; i++)
                room[i] = "";
            execv("/proc/self/exe", room);
            free(room);  /* no /proc: served with the room it has */
        }
    }
    struct server srv = {.program = strdup(argv[0]), .listen_fd = -1};
    if (!srv.program)
        return 1;
    keep_title_room(argc, argv);
    memcpy(addr.sun_path, path, strlen(path));
    srv.listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (srv.listen_fd < 0)
        return fail_at(path, "socket");
    mode_t umask_was = umask(0177);  /* 0600: the user's alone from its first moment */
    int bound = bind(srv.listen_fd, (struct sockaddr *)&addr, sizeof addr);
    umask(umask_was);  /* (supervisors and their workloads get the unit's) */
    if (bound < 0)  /* EADDRINUSE: a file there, which is not this server's to remove */
        return fail_at(path, "bind");
    if (listen(srv.listen_fd, CONNS_MAX) < 0)
        return fail_at(path, "listen");
    notify_ready();
    return serve(&srv);
}
