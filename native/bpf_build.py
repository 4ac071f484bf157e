"""cffi (API mode) builder for `xhagent._bpf`: a thin binding over libbpf 1.x.

Pointer-returning libbpf calls return NULL and set errno (libbpf >= 1.0 is strict
by default); read it with `ffi.errno` right after the call. Integer calls return
-errno. Helpers that need C (ring-buffer batching, log capture, perf_event_open)
live in bpf_glue.c.
"""

import os
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

CDEF = """
struct bpf_object; struct bpf_program; struct bpf_map; struct bpf_link; struct btf;
struct bpf_object_open_opts; struct bpf_map_info;
typedef unsigned int __u32;

/* object */
struct bpf_object *bpf_object__open_file(const char *path, const struct bpf_object_open_opts *opts);
int bpf_object__load(struct bpf_object *obj);
void bpf_object__close(struct bpf_object *obj);
const char *bpf_object__name(const struct bpf_object *obj);
struct bpf_program *bpf_object__find_program_by_name(const struct bpf_object *obj,
    const char *name);
struct bpf_map *bpf_object__find_map_by_name(const struct bpf_object *obj, const char *name);
struct bpf_program *bpf_object__next_program(const struct bpf_object *obj,
    struct bpf_program *prog);
struct bpf_map *bpf_object__next_map(const struct bpf_object *obj, const struct bpf_map *map);

/* programs */
const char *bpf_program__name(const struct bpf_program *prog);
const char *bpf_program__section_name(const struct bpf_program *prog);
int bpf_program__fd(const struct bpf_program *prog);
int bpf_program__set_autoload(struct bpf_program *prog, bool autoload);
bool bpf_program__autoload(const struct bpf_program *prog);
struct bpf_link *bpf_program__attach(const struct bpf_program *prog);
struct bpf_link *bpf_program__attach_raw_tracepoint(const struct bpf_program *prog,
    const char *tp_name);
struct bpf_link *bpf_program__attach_perf_event(const struct bpf_program *prog, int pfd);
int bpf_link__destroy(struct bpf_link *link);
int bpf_link__fd(const struct bpf_link *link);

/* maps */
const char *bpf_map__name(const struct bpf_map *map);
int bpf_map__fd(const struct bpf_map *map);
int bpf_map__type(const struct bpf_map *map);
__u32 bpf_map__key_size(const struct bpf_map *map);
__u32 bpf_map__value_size(const struct bpf_map *map);
__u32 bpf_map__max_entries(const struct bpf_map *map);
int bpf_map_lookup_elem(int fd, const void *key, void *value);
int bpf_map_update_elem(int fd, const void *key, const void *value, uint64_t flags);
int bpf_map_delete_elem(int fd, const void *key);
int bpf_map_get_next_key(int fd, const void *key, void *next_key);

/* misc */
long libbpf_get_error(const void *ptr);
int libbpf_strerror(int err, char *buf, size_t size);
int libbpf_num_possible_cpus(void);
struct btf *btf__load_vmlinux_btf(void);
void btf__free(struct btf *btf);
__u32 btf__type_cnt(const struct btf *btf);

"""


ffibuilder = FFI()
# bpf_glue.h is plain declarations: cffi reads it as it is, so the two cannot drift apart.
ffibuilder.cdef(CDEF + (HERE / "bpf_glue.h").read_text())
ffibuilder.set_source(
    "xhagent._bpf",
    '#include <bpf/libbpf.h>\n#include <bpf/bpf.h>\n#include <bpf/btf.h>\n#include "bpf_glue.h"\n',
    # absolute: ffibuilder.compile() runs the compiler from its tmpdir
    # setuptools insists on paths relative to the project root (the cwd of a build).
    sources=[os.path.relpath(HERE / "bpf_glue.c")],
    include_dirs=[os.path.relpath(HERE)],
    libraries=["bpf"],
    extra_compile_args=["-O2", "-Wall"],
)
