/* spawn_glue.h: start a process inside a cgroup v2 group (xhagent._spawn).
 * Plain declarations only: native/spawn_build.py hands this file to cffi's cdef as it is. */

struct xh_spawn_req {
    int32_t use_clone3;        /* 1: clone3(CLONE_INTO_CGROUP | CLONE_PIDFD) into cgroup_fd */
    int32_t cgroup_fd;         /* the group's directory (clone3 way) */
    int32_t procs_fd;          /* its cgroup.procs, open for writing (fork way): the child writes "0" */
    int32_t err_fd;            /* write end of a CLOEXEC pipe: a struct xh_spawn_err when a step fails */
    const char *const *paths;  /* executables to try in order (PATH already searched), NULL-terminated */
    char *const *argv;         /* NULL-terminated */
    char *const *envp;         /* NULL-terminated */
    const char *cwd;           /* NULL: the caller's */
    int32_t stdio[3];          /* sources for fds 0, 1, 2; -1: inherited as they are */
    const int32_t *keep;       /* further fds the child keeps (ascending); every other fd >= 3 is closed */
    int32_t nkeep;
    int32_t new_session;       /* setsid() in the child */
    const int32_t *mask;       /* the child's signal mask, as signal numbers */
    int32_t nmask;
    int32_t set_ids;           /* 1: drop supplementary groups, then setgid(gid), setuid(uid) (0: as is,
                                  so a request that does not name these fields keeps the caller's ids) */
    uint32_t uid;
    uint32_t gid;
    int32_t reset_ignored;     /* 1: signals the caller ignores go back to their default too
                                  (a supervisor's workload starts clean); 0: they stay ignored */
    int32_t share_vm;          /* 1 (clone3 way, x86_64): the child shares the caller's memory until
                                  its exec, and xh_spawn returns only once it has exec'd or failed */
    int32_t set_oom_score_adj; /* 1: the child writes oom_score_adj to /proc/self/oom_score_adj (a
                                  supervisor the OOM killer spares starts a workload it does not) */
    int32_t oom_score_adj;
};

struct xh_spawn_err {
    int32_t stage;             /* XH_STAGE_* */
    int32_t err;               /* errno */
};

/* The child's steps, in order; the one that failed is reported. */
#define XH_STAGE_JOIN 1
#define XH_STAGE_FDS 2
#define XH_STAGE_CWD 3
#define XH_STAGE_SESSION 4
#define XH_STAGE_SIGNALS 5
#define XH_STAGE_EXEC 6
#define XH_STAGE_IDS 7          /* runs just before the exec: numbered last so that 1..6 keep their meaning */
#define XH_STAGE_OOM 8          /* runs before the ids (a process's /proc/self is root's once setuid) */

/* The child's pid (> 0), or -errno when no child was made. *pidfd: its pidfd (clone3 way), else -1. */
int32_t xh_spawn(const struct xh_spawn_req *req, int32_t *pidfd);

/* 0 when this kernel takes clone3(CLONE_INTO_CGROUP), else the errno that says it does not
 * (ENOSYS: no clone3, or a seccomp filter hides it; E2BIG: clone3 without the cgroup field). */
int32_t xh_clone3_cgroup_probe(void);
