/* shim_spares.c: `xhagent-shim --make-spares DIR --count N --keep-free BYTES`.
 *
 * A start's run directory costs the state disk inodes (the task's directory, its attempt's,
 * two record files) and blocks (each record's reservation). On ext4 without a journal an
 * inode is the dear part: its allocation passes over every inode deleted in the last
 * minute, which made a task's directories and records cost 0.5-3.6 ms of kernel CPU on
 * this project's machines. A spare run directory is all of that made beforehand, when the
 * node is idle:
 *
 *   DIR/NAME/                  the task's directory to be (renamed into place by the shim)
 *   DIR/NAME/1/                its first attempt's (SPARE_ATTEMPT)
 *   DIR/NAME/1/started.tmp     RECORD_SIZE bytes of spaces: the reservations, as
 *   DIR/NAME/1/exit.tmp        shim.c's reserve_record writes them
 *
 * Each is made as DIR/.making-NAME and renamed to DIR/NAME once whole, so a spare seen is a
 * whole one. This maker runs at the idle scheduling class (SCHED_IDLE, and the idle I/O
 * class): it takes only what nothing else wants. It first removes the .making-* that a
 * maker stopped half-way left (its own kind, and only the four names it makes), then makes
 * spares until DIR holds N, and stops early where the filesystem would keep less than
 * BYTES free. Exit 0 once DIR held N; 3 when it stopped for the disk's free space; 1 with a
 * message on stderr; 2 for a bad command line.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#define MAKING "making-"  /* after the dot of a spare being made */
#define STOPPED_FOR_SPACE 3
#define IOPRIO_CLASS_IDLE 3
#define IOPRIO_CLASS_SHIFT 13
#define IOPRIO_WHO_PROCESS 1

static const char *const files[2] = {"started.tmp", "exit.tmp"};

static int fail(const char *what, const char *name)
{
    fprintf(stderr, "xhagent-shim --make-spares: %s %s: %s\n", what, name, strerror(errno));
    return 1;
}

/* The idle classes: where they cannot be had, the lowest nice value. */
static void idle_priority(void)
{
    struct sched_param none = {0};
    if (sched_setscheduler(0, SCHED_IDLE, &none) < 0)
        setpriority(PRIO_PROCESS, 0, 19);
    syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT);
}

/* A half-made spare's files and directories: those this maker makes, and nothing else (a
 * directory holding anything more stays, and the error says so). */
static int remove_making(int dir_fd, const char *name)
{
    int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : fail("open", name);
    int att = openat(fd, SPARE_ATTEMPT, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (att >= 0) {
        for (int i = 0; i < 2; i++)
            if (unlinkat(att, files[i], 0) < 0 && errno != ENOENT)
                return close(att), close(fd), fail("remove", files[i]);
        close(att);
    }
    int bad = unlinkat(fd, SPARE_ATTEMPT, AT_REMOVEDIR) < 0 && errno != ENOENT;
    close(fd);
    if (bad || unlinkat(dir_fd, name, AT_REMOVEDIR) < 0)
        return fail("remove", name);
    return 0;
}

/* One spare, whole, under `name`; 0, or 1 with the message written. */
static int make_one(int dir_fd, const char *making, const char *name)
{
    static char padding[RECORD_SIZE];
    memset(padding, ' ', sizeof padding);
    if (mkdirat(dir_fd, making, 0750) < 0)
        return fail("mkdir", making);
    int fd = openat(dir_fd, making, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || mkdirat(fd, SPARE_ATTEMPT, 0750) < 0)
        return fail("make", making);
    int att = openat(fd, SPARE_ATTEMPT, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    if (att < 0)
        return fail("open", making);
    for (int i = 0; i < 2; i++) {
        int f = openat(att, files[i], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0640);
        if (f < 0 || write(f, padding, sizeof padding) != (ssize_t)sizeof padding) {
            if (f >= 0)
                close(f);
            close(att);
            return fail("write", files[i]);
        }
        close(f);
    }
    close(att);
    if (renameat2(dir_fd, making, dir_fd, name, RENAME_NOREPLACE) < 0)
        return fail("rename", making);
    return 0;
}

int shim_make_spares(int argc, char **argv)
{
    const char *dir = argv[2];
    long count = -1;
    unsigned long long keep_free = 0;
    for (int i = 3; i + 1 < argc; i += 2) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(argv[i + 1], &end, 10);
        if (errno || *end || !*argv[i + 1] || argv[i + 1][0] == '-')
            count = -2;
        else if (!strcmp(argv[i], "--count") && v <= 1 << 20)
            count = (long)v;
        else if (!strcmp(argv[i], "--keep-free"))
            keep_free = v;
        else
            count = -2;
    }
    if (count < 0 || (argc - 3) % 2) {
        fprintf(stderr, "usage: xhagent-shim --make-spares DIR --count N --keep-free BYTES\n");
        return 2;
    }
    idle_priority();
    if (mkdir(dir, 0750) < 0 && errno != EEXIST)
        return fail("mkdir", dir);
    int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir_fd < 0)
        return fail("open", dir);
    DIR *d = fdopendir(dup(dir_fd));
    if (!d)
        return fail("read", dir);
    long have = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] != '.')
            have++;
        else if (!strncmp(e->d_name + 1, MAKING, strlen(MAKING)) && remove_making(dir_fd, e->d_name))
            return closedir(d), 1;
    }
    closedir(d);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (long i = 0; have < count; i++) {
        struct statvfs fs;
        if (fstatvfs(dir_fd, &fs) < 0)
            return fail("statvfs", dir);
        if ((unsigned long long)fs.f_bavail * fs.f_frsize < keep_free + 2 * RECORD_SIZE)
            return STOPPED_FOR_SPACE;  /* the disk's last bytes are the agent's records' and store's */
        char name[64], making[80];
        snprintf(name, sizeof name, "%llx-%d-%ld", (long long)now.tv_sec, (int)getpid(), i);
        snprintf(making, sizeof making, "." MAKING "%s", name);
        if (make_one(dir_fd, making, name))
            return 1;
        have++;
    }
    return 0;
}
