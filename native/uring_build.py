"""cffi (API mode) builder for `xhagent._uring`, a thin binding of liburing.

liburing 2.3 (Debian 12) ships no liburing-ffi, and most of its API is `static inline`,
so the binding is compiled against the header: cffi emits a real function for each inline.
The few loops that run once per I/O live in uring_glue.c so Python sees batches.
"""

import os
import shutil
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

# Opcode names exported as constants; the doctor and the probe API report by name.
OPCODES = """
NOP READV WRITEV FSYNC READ_FIXED WRITE_FIXED POLL_ADD POLL_REMOVE SYNC_FILE_RANGE
SENDMSG RECVMSG TIMEOUT TIMEOUT_REMOVE ACCEPT ASYNC_CANCEL LINK_TIMEOUT CONNECT
FALLOCATE OPENAT CLOSE FILES_UPDATE STATX READ WRITE FADVISE MADVISE SEND RECV OPENAT2
EPOLL_CTL SPLICE PROVIDE_BUFFERS REMOVE_BUFFERS TEE SHUTDOWN RENAMEAT UNLINKAT MKDIRAT
SYMLINKAT LINKAT MSG_RING FSETXATTR SETXATTR FGETXATTR GETXATTR SOCKET URING_CMD
SEND_ZC SENDMSG_ZC LAST
""".split()

SETUP_FLAGS = """IOPOLL SQPOLL SQ_AFF CQSIZE CLAMP ATTACH_WQ R_DISABLED SUBMIT_ALL COOP_TASKRUN
TASKRUN_FLAG SQE128 CQE32 SINGLE_ISSUER DEFER_TASKRUN""".split()
SQE_FLAGS = "FIXED_FILE IO_DRAIN IO_LINK IO_HARDLINK ASYNC BUFFER_SELECT CQE_SKIP_SUCCESS".split()
FEATURES = """SINGLE_MMAP NODROP SUBMIT_STABLE RW_CUR_POS CUR_PERSONALITY FAST_POLL POLL_32BITS
SQPOLL_NONFIXED EXT_ARG NATIVE_WORKERS RSRC_TAGS CQE_SKIP LINKED_FILE""".split()

CONSTANTS = "\n".join(
    [f"static const int IORING_OP_{n};" for n in OPCODES]
    + [f"#define IORING_SETUP_{n} ..." for n in SETUP_FLAGS]
    + [f"#define IOSQE_{n} ..." for n in SQE_FLAGS]
    + [f"#define IORING_FEAT_{n} ..." for n in FEATURES]
    + [
        f"#define {n} ..."
        for n in (
            "O_DIRECT",
            "O_RDONLY",
            "O_WRONLY",
            "O_RDWR",
            "O_CLOEXEC",
            "O_CREAT",
            "AT_FDCWD",
            "AT_STATX_SYNC_AS_STAT",
            "STATX_BASIC_STATS",
            "IORING_FILE_INDEX_ALLOC",
            "IORING_ASYNC_CANCEL_ALL",
            "IORING_ASYNC_CANCEL_ANY",
            "ECANCELED",
            "EOPNOTSUPP",
        )
    ]
)

CDEF = (
    CONSTANTS
    + """
typedef unsigned int mode_t;
struct iovec { void *iov_base; size_t iov_len; };
struct statx { uint32_t stx_mask; uint32_t stx_blksize; uint64_t stx_attributes; uint32_t stx_nlink;
               uint32_t stx_uid; uint32_t stx_gid; uint16_t stx_mode; uint64_t stx_ino;
               uint64_t stx_size; uint64_t stx_blocks; ...; };
struct io_uring_sqe { uint8_t opcode; uint8_t flags; uint64_t user_data; ...; };
struct io_uring_cqe { uint64_t user_data; int32_t res; uint32_t flags; ...; };
struct io_uring_params { uint32_t sq_entries; uint32_t cq_entries; uint32_t flags;
    uint32_t sq_thread_cpu;
                         uint32_t sq_thread_idle; uint32_t features; uint32_t wq_fd; ...; };
struct io_uring { int ring_fd; unsigned flags; unsigned features; ...; };
struct io_uring_probe { uint8_t last_op; uint8_t ops_len; ...; };
struct __kernel_timespec { int64_t tv_sec; long long tv_nsec; };

int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags);
int io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p);
void io_uring_queue_exit(struct io_uring *ring);

struct io_uring_sqe *io_uring_get_sqe(struct io_uring *ring);
void io_uring_sqe_set_data64(struct io_uring_sqe *sqe, uint64_t data);
void io_uring_sqe_set_flags(struct io_uring_sqe *sqe, unsigned flags);
void io_uring_prep_nop(struct io_uring_sqe *sqe);
void io_uring_prep_read(struct io_uring_sqe *sqe, int fd, void *buf, unsigned nbytes,
    uint64_t offset);
void io_uring_prep_write(struct io_uring_sqe *sqe, int fd, const void *buf, unsigned nbytes,
    uint64_t offset);
void io_uring_prep_readv(struct io_uring_sqe *sqe, int fd, const struct iovec *iovecs,
    unsigned nr_vecs, uint64_t offset);
void io_uring_prep_writev(struct io_uring_sqe *sqe, int fd, const struct iovec *iovecs,
    unsigned nr_vecs, uint64_t offset);
void io_uring_prep_read_fixed(struct io_uring_sqe *sqe, int fd, void *buf, unsigned nbytes,
    uint64_t offset, int buf_index);
void io_uring_prep_write_fixed(struct io_uring_sqe *sqe, int fd, const void *buf,
    unsigned nbytes, uint64_t offset, int buf_index);
void io_uring_prep_openat(struct io_uring_sqe *sqe, int dfd, const char *path, int flags,
    mode_t mode);
void io_uring_prep_openat_direct(struct io_uring_sqe *sqe, int dfd, const char *path, int flags,
    mode_t mode, unsigned file_index);
void io_uring_prep_close(struct io_uring_sqe *sqe, int fd);
void io_uring_prep_close_direct(struct io_uring_sqe *sqe, unsigned file_index);
void io_uring_prep_statx(struct io_uring_sqe *sqe, int dfd, const char *path, int flags,
    unsigned mask, struct statx *statxbuf);
void io_uring_prep_cancel64(struct io_uring_sqe *sqe, uint64_t user_data, int flags);

int io_uring_submit(struct io_uring *ring);
int io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr);
int io_uring_wait_cqe(struct io_uring *ring, struct io_uring_cqe **cqe_ptr);
int io_uring_wait_cqe_nr(struct io_uring *ring, struct io_uring_cqe **cqe_ptr, unsigned wait_nr);
int io_uring_wait_cqe_timeout(struct io_uring *ring, struct io_uring_cqe **cqe_ptr,
    struct __kernel_timespec *ts);
int io_uring_peek_cqe(struct io_uring *ring, struct io_uring_cqe **cqe_ptr);
unsigned io_uring_peek_batch_cqe(struct io_uring *ring, struct io_uring_cqe **cqes, unsigned count);
void io_uring_cqe_seen(struct io_uring *ring, struct io_uring_cqe *cqe);
void io_uring_cq_advance(struct io_uring *ring, unsigned nr);
unsigned io_uring_sq_ready(const struct io_uring *ring);
unsigned io_uring_sq_space_left(const struct io_uring *ring);
unsigned io_uring_cq_ready(const struct io_uring *ring);

int io_uring_register_buffers(struct io_uring *ring, const struct iovec *iovecs,
    unsigned nr_iovecs);
int io_uring_unregister_buffers(struct io_uring *ring);
int io_uring_register_files(struct io_uring *ring, const int *files, unsigned nr_files);
int io_uring_register_files_update(struct io_uring *ring, unsigned off, const int *files,
    unsigned nr_files);
int io_uring_unregister_files(struct io_uring *ring);
int io_uring_register_eventfd(struct io_uring *ring, int fd);
int io_uring_unregister_eventfd(struct io_uring *ring);

struct io_uring_probe *io_uring_get_probe_ring(struct io_uring *ring);
struct io_uring_probe *io_uring_get_probe(void);
void io_uring_free_probe(struct io_uring_probe *probe);
int io_uring_opcode_supported(const struct io_uring_probe *p, int op);

"""
    # uring_glue.h is plain declarations: cffi reads it as it is, so the two cannot drift apart.
    + (HERE / "uring_glue.h").read_text()
    + (HERE / "sampler_glue.h").read_text()
)

ffibuilder = FFI()
ffibuilder.cdef(CDEF)


def _require_header():
    for inc in ("/usr/include", "/usr/local/include"):
        if (Path(inc) / "liburing.h").exists():
            return
    sys.exit("native build: liburing.h not found: install the Debian package `liburing-dev`")


_require_header()
if shutil.which("cc") is None and shutil.which("gcc") is None:
    sys.exit("native build: no C compiler: install the Debian package `build-essential`")

ffibuilder.set_source(
    "xhagent._uring",
    "#ifndef _GNU_SOURCE\n#define _GNU_SOURCE\n#endif\n"
    "#include <fcntl.h>\n#include <sys/stat.h>\n#include <errno.h>\n#include <liburing.h>\n"
    '#include "uring_glue.h"\n#include "sampler_glue.h"\n',
    # setuptools insists on paths relative to the project root (the cwd of a build).
    sources=[os.path.relpath(HERE / f) for f in ("uring_glue.c", "sampler_glue.c")],
    include_dirs=[os.path.relpath(HERE)],
    libraries=["uring"],
    extra_compile_args=["-O2", "-Wall"],
)
