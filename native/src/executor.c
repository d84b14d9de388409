/* The agent's executor (docs/agent-protocol.md): the child process that holds the OpenCL context. It reads
 * frames from the supervisor over a socketpair and answers each; it never sees the host's link. Handles are
 * indices + 1 into growing tables and are never reused, so a stale handle is an error, not another object. */
#define _POSIX_C_SOURCE 200809L
#include "agent.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bincache.h"
#include "common.h"
#include "opencl.h"
#include "proto.h"
#include "sha256.h"

/* What the supervisor hands the executor (issue 54): the work folder, as an argument. The executor never reads
 * the supervisor's state: it is forked after the supervisor wiped the token, and HELLO reaches it with an empty
 * token, so it cannot leak what it never held. */
static const char *work_dir = "";

/* A line on stderr, "tuner-agent[pid]: ..." (the executor's own: it shares no state with the supervisor). */
static void ex_log(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static void ex_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tnr_log_line("tuner-agent", fmt, ap);
    va_end(ap);
}

#define MAX_ARGS 1024
#define MAX_LAUNCHES 4096
#define MAX_ROUNDS 1000000u

typedef struct {
    cl_mem mem;
    int live, image, half;
    uint64_t bytes;
    uint32_t w, h;
} ex_mem;

typedef struct {
    cl_program prog;
    int live;
} ex_prog;

typedef struct {
    cl_kernel k;
    int live, has_local;
    size_t global[3], local[3];
    uint32_t nargs, *args;
} ex_launch;

typedef struct {
    int loaded;
    tcl_api api;
    char load_err[TNR_ERRLEN];
    tcl_device *devs;
    int ndev;
    int *half; /* per device: -1 not asked yet */
    int open; /* index of the opened device, -1 none */
    cl_context ctx;
    cl_command_queue q;
    char cache_key[160];
    ex_mem *mems;
    ex_prog *progs;
    ex_launch *launches;
    uint32_t nmem, nprog, nlaunch, capmem, capprog, caplaunch;
    int lost; /* the device faulted: reply, then exit (the supervisor starts another executor) */
} executor;

static int fail(char *msg, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int fail(char *msg, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, TNR_ERRLEN, fmt, ap);
    va_end(ap);
    return status;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- JSON output (HELLO, OPEN) ---- */

static void put_json_str(tpr_buf *b, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), i = 0;
    tpr_put_raw(b, "\"", 1);
    while (i < n) {
        unsigned c = p[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            tpr_put_raw(b, esc, 2);
            i++;
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            tpr_put_raw(b, esc, 6);
            i++;
        } else if (c < 0x80) {
            tpr_put_raw(b, p + i, 1);
            i++;
        } else {
            size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
            if (len && len <= n - i && tnr_is_text(p + i, len)) {
                tpr_put_raw(b, p + i, len);
                i += len;
            } else {
                tpr_put_raw(b, "\\ufffd", 6);
                i++;
            }
        }
    }
    tpr_put_raw(b, "\"", 1);
}

static void putf(tpr_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void putf(tpr_buf *b, const char *fmt, ...) {
    char tmp[512];
    int n;
    va_list ap;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) tpr_put_raw(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static int half_images(executor *ex, int i) {
    if (ex->half[i] < 0) ex->half[i] = tcl_half_images(&ex->api, &ex->devs[i]);
    return ex->half[i];
}

/* A device's profile: exactly the fields of tuner.target.DeviceInfo, plus extensions and the fingerprint. */
static void profile_json(executor *ex, tpr_buf *b, int i) {
    const tcl_device *d = &ex->devs[i];
    putf(b, "{\"index\": %d, \"platform\": ", d->index);
    put_json_str(b, d->platform_name);
    putf(b, ", \"name\": ");
    put_json_str(b, d->name);
    putf(b, ", \"type\": \"%s\", \"driver_version\": ", d->type);
    put_json_str(b, d->driver_version);
    putf(b, ", \"opencl_version\": ");
    put_json_str(b, d->opencl_version);
    putf(b, ", \"image_support\": %s, \"image2d_max_width\": %llu, \"image2d_max_height\": %llu", d->image_support ? "true" : "false",
         (unsigned long long)d->image2d_max_width, (unsigned long long)d->image2d_max_height);
    putf(b, ", \"max_work_group_size\": %llu, \"max_work_item_sizes\": [%llu, %llu, %llu]",
         (unsigned long long)d->max_work_group_size, (unsigned long long)d->max_work_item_sizes[0],
         (unsigned long long)d->max_work_item_sizes[1], (unsigned long long)d->max_work_item_sizes[2]);
    putf(b, ", \"local_mem_bytes\": %llu, \"global_mem_bytes\": %llu, \"max_mem_alloc_bytes\": %llu",
         (unsigned long long)d->local_mem_bytes, (unsigned long long)d->global_mem_bytes,
         (unsigned long long)d->max_mem_alloc_bytes);
    putf(b, ", \"compute_units\": %llu, \"fp16\": %s, \"half_images\": %s, \"fingerprint\": ",
         (unsigned long long)d->compute_units, d->fp16 ? "true" : "false", half_images(ex, i) ? "true" : "false");
    put_json_str(b, d->fingerprint);
    putf(b, ", \"extensions\": ");
    put_json_str(b, d->extensions);
    putf(b, "}");
}

static const char *abi(void) {
#if defined(__aarch64__)
#if defined(__ANDROID__)
    return "arm64-v8a";
#else
    return "aarch64";
#endif
#elif defined(__arm__)
#if defined(__ANDROID__)
    return "armeabi-v7a";
#else
    return "arm";
#endif
#elif defined(__x86_64__)
    return "x86_64";
#elif defined(__i386__)
    return "x86";
#elif defined(__riscv)
    return "riscv64";
#else
    return "unknown";
#endif
}

#if defined(__ANDROID__)
#include <sys/system_properties.h>
#endif

static int android_sdk(void) {
#if defined(__ANDROID__)
    char v[PROP_VALUE_MAX] = "";
    if (__system_property_get("ro.build.version.sdk", v) > 0) return atoi(v);
#endif
    return -1;
}

/* ---- state ---- */

static void load(executor *ex) {
    char err[TNR_ERRLEN];
    int i;
    if (ex->loaded) return;
    ex->loaded = 1;
    if (tcl_load(&ex->api, err) != TNR_OK) {
        snprintf(ex->load_err, sizeof ex->load_err, "%s", err);
        return;
    }
    if (tcl_list_devices(&ex->api, &ex->devs, &ex->ndev, err) != TNR_OK) {
        snprintf(ex->load_err, sizeof ex->load_err, "%s", err);
        ex->ndev = 0;
        return;
    }
    ex->half = malloc((size_t)ex->ndev * sizeof *ex->half);
    if (!ex->half) {
        snprintf(ex->load_err, sizeof ex->load_err, "out of memory");
        ex->ndev = 0;
        return;
    }
    for (i = 0; i < ex->ndev; i++) ex->half[i] = -1;
}

static void release_all(executor *ex) {
    uint32_t i;
    if (ex->q) ex->api.Finish(ex->q);
    for (i = 0; i < ex->nlaunch; i++)
        if (ex->launches[i].live) {
            ex->api.ReleaseKernel(ex->launches[i].k);
            free(ex->launches[i].args);
            ex->launches[i].live = 0;
        }
    for (i = 0; i < ex->nmem; i++)
        if (ex->mems[i].live) {
            ex->api.ReleaseMemObject(ex->mems[i].mem);
            ex->mems[i].live = 0;
        }
    for (i = 0; i < ex->nprog; i++)
        if (ex->progs[i].live) {
            ex->api.ReleaseProgram(ex->progs[i].prog);
            ex->progs[i].live = 0;
        }
}

static void close_device(executor *ex) {
    release_all(ex);
    if (ex->q) ex->api.ReleaseCommandQueue(ex->q);
    if (ex->ctx) ex->api.ReleaseContext(ex->ctx);
    ex->q = NULL;
    ex->ctx = NULL;
    ex->open = -1;
}

static void shutdown_executor(executor *ex) {
    close_device(ex);
    free(ex->mems);
    free(ex->progs);
    free(ex->launches);
    free(ex->devs);
    free(ex->half);
    if (ex->api.handle) tcl_unload(&ex->api);
}

/* Grows a table to hold one more entry; the new entry's index, or -1 (out of memory or of handles). */
static long grow(void **table, uint32_t *n, uint32_t *cap, size_t size) {
    if (*n >= 0x7FFFFFF0u) return -1;
    if (*n == *cap) {
        uint32_t c = *cap ? *cap * 2 : 64;
        void *t = realloc(*table, (size_t)c * size);
        if (!t) return -1;
        *table = t;
        *cap = c;
    }
    memset((char *)*table + (size_t)*n * size, 0, size);
    return (long)(*n)++;
}

static ex_mem *get_mem(executor *ex, uint32_t h) {
    return h >= 1 && h <= ex->nmem && ex->mems[h - 1].live ? &ex->mems[h - 1] : NULL;
}
static ex_prog *get_prog(executor *ex, uint32_t h) {
    return h >= 1 && h <= ex->nprog && ex->progs[h - 1].live ? &ex->progs[h - 1] : NULL;
}
static ex_launch *get_launch(executor *ex, uint32_t h) {
    return h >= 1 && h <= ex->nlaunch && ex->launches[h - 1].live ? &ex->launches[h - 1] : NULL;
}

#define BAD(...) fail(msg, TPR_BAD_REQUEST, __VA_ARGS__)
#define NEED_END(r) \
    do {            \
        if (!tpr_end(r)) return BAD("%s body: %s", tpr_type_name(type), (r)->why); \
    } while (0)
#define NEED_OPEN()                                                                        \
    do {                                                                                   \
        if (ex->open < 0) return BAD("%s before OPEN: open a device first", tpr_type_name(type)); \
    } while (0)

/* ---- messages ---- */

/* A JSON text built in j as the reply's str (HELLO, OPEN); j is freed either way. */
static int reply_json(tpr_buf *j, tpr_buf *out, char *msg) {
    if (j->oom) {
        tpr_buf_free(j);
        return fail(msg, TPR_RUNTIME, "out of memory");
    }
    tpr_put_str(out, (const char *)j->p, j->n);
    tpr_buf_free(j);
    return TPR_OK;
}

static int do_hello(executor *ex, unsigned type, tpr_reader *r, tpr_buf *out, char *msg) {
    tpr_buf j = {0};
    char *token = tpr_str(r, NULL); /* the supervisor proved the token and forwards HELLO with an empty one */
    int i;
    free(token);
    NEED_END(r);
    load(ex);
    putf(&j, "{\"protocol\": %d, \"agent\": \"%s\", \"pid\": %ld, \"executor_pid\": %ld, \"abi\": \"%s\", \"os\": \"%s\"",
         TPR_VERSION, TNR_AGENT_VERSION, (long)getppid(), (long)getpid(), abi(),
#if defined(__ANDROID__)
         "android"
#elif defined(__linux__)
         "linux"
#else
         "unix"
#endif
    );
    if (android_sdk() >= 0)
        putf(&j, ", \"android_sdk\": %d", android_sdk());
    else
        putf(&j, ", \"android_sdk\": null");
    putf(&j, ", \"opencl_library\": ");
    if (ex->api.handle)
        put_json_str(&j, ex->api.path);
    else
        putf(&j, "null");
    if (ex->load_err[0]) {
        putf(&j, ", \"opencl_error\": ");
        put_json_str(&j, ex->load_err);
    }
    putf(&j, ", \"work_dir\": ");
    put_json_str(&j, work_dir);
    putf(&j, ", \"devices\": [");
    for (i = 0; i < ex->ndev; i++) {
        if (i) putf(&j, ", ");
        profile_json(ex, &j, i);
    }
    putf(&j, "]}");
    return reply_json(&j, out, msg);
}

static int do_open(executor *ex, unsigned type, tpr_reader *r, tpr_buf *out, char *msg) {
    uint32_t index = tpr_u32(r);
    tpr_buf j = {0};
    char err[TNR_ERRLEN];
    NEED_END(r);
    load(ex);
    if (!ex->ndev) return fail(msg, TPR_NO_DEVICE, "%s", ex->load_err[0] ? ex->load_err : "no OpenCL device");
    if (index >= (uint32_t)ex->ndev)
        return fail(msg, TPR_NO_DEVICE, "no OpenCL device with index %u: the agent lists %d", index, ex->ndev);
    if (ex->open != (int)index) {
        close_device(ex);
        if (tcl_context(&ex->api, &ex->devs[index], &ex->ctx, err) != TNR_OK)
            return fail(msg, TPR_RUNTIME, "%s", err);
        if (tcl_queue(&ex->api, ex->ctx, &ex->devs[index], 1, &ex->q, err) != TNR_OK) {
            ex->api.ReleaseContext(ex->ctx);
            ex->ctx = NULL;
            return fail(msg, TPR_RUNTIME, "%s", err);
        }
        ex->open = (int)index;
        tnr_binary_cache_key(&ex->devs[index], ex->cache_key, sizeof ex->cache_key);
    }
    profile_json(ex, &j, (int)index);
    return reply_json(&j, out, msg);
}

static int new_program(executor *ex, cl_program prog, uint32_t *handle, char *msg) {
    long i = grow((void **)&ex->progs, &ex->nprog, &ex->capprog, sizeof *ex->progs);
    if (i < 0) {
        ex->api.ReleaseProgram(prog);
        return fail(msg, TPR_RUNTIME, "out of memory (programs)");
    }
    ex->progs[i].prog = prog;
    ex->progs[i].live = 1;
    *handle = (uint32_t)i + 1;
    return TPR_OK;
}

static int do_build(executor *ex, unsigned type, tpr_reader *r, tpr_buf *out, char *msg) {
    size_t slen = 0, olen = 0;
    char *src = tpr_str(r, &slen), *opts = tpr_str(r, &olen);
    uint32_t flags = tpr_u32(r);
    char dir[4096], path[4400], hex[65], tag[300], err[TNR_ERRLEN], log[4096];
    tnr_sha256_ctx c;
    unsigned char digest[32], *bin = NULL;
    size_t blen = 0;
    cl_program prog = NULL;
    uint32_t handle = 0;
    int cached = 0, rc, i;
    double t0 = now_s();
    (void)type;
    if (!tpr_end(r) || ex->open < 0) {
        free(src);
        free(opts);
        if (r->bad) return BAD("BUILD body: %s", r->why);
        return BAD("BUILD before OPEN: open a device first");
    }
    if (!slen) {
        free(src);
        free(opts);
        return BAD("BUILD of an empty source");
    }
    if (flags & ~(uint32_t)TPR_BUILD_KEEP) {
        free(src);
        free(opts);
        return BAD("BUILD flags %u (1: keep the binary)", flags);
    }
    tnr_sha256_init(&c);
    tnr_sha256_update(&c, opts, olen);
    tnr_sha256_update(&c, "\0", 1);
    tnr_sha256_update(&c, src, slen);
    tnr_sha256_final(&c, digest);
    for (i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    snprintf(dir, sizeof dir, "%s/binaries/%s", work_dir, ex->cache_key);
    snprintf(path, sizeof path, "%s/%s.bin", dir, hex);
    snprintf(tag, sizeof tag, "%s/%s", ex->cache_key, hex);
    bin = tnr_bincache_read(dir, path, tag, &blen);
    if (bin) {
        if (tcl_build_binary(&ex->api, ex->ctx, &ex->devs[ex->open], bin, blen, opts, &prog, err) == TNR_OK) {
            cached = 1;
        } else {
            unlink(path); /* refused (another driver build, a damaged file): rebuilt from source below */
            ex_log("a cached binary was refused (%s): deleted %s, building from source", err, path);
        }
        free(bin);
        bin = NULL;
    }
    if (!prog) {
        rc = tcl_build_source(&ex->api, ex->ctx, &ex->devs[ex->open], src, slen, opts, &prog, err);
        if (rc != TNR_OK) {
            free(src);
            free(opts);
            return fail(msg, rc == TNR_E_BUILD ? TPR_COMPILE : TPR_RUNTIME, "%s", err);
        }
        /* the binary only when asked: a driver may compile again to give it (PoCL: as long as the build), and a
         * tuning run builds each source once */
        if ((flags & TPR_BUILD_KEEP) && tcl_program_binary(&ex->api, prog, &bin, &blen, err) == TNR_OK && bin && blen)
            tnr_bincache_write(dir, path, tag, bin, blen);
        free(bin);
    }
    free(src);
    free(opts);
    tcl_build_log(&ex->api, prog, &ex->devs[ex->open], log, sizeof log);
    if ((rc = new_program(ex, prog, &handle, msg)) != TPR_OK) return rc;
    tpr_put_u32(out, handle);
    tpr_put_cstr(out, log);
    tpr_put_f64(out, now_s() - t0);
    tpr_put_u32(out, (uint32_t)cached);
    return TPR_OK;
}

static int do_alloc(executor *ex, unsigned type, tpr_reader *r, tpr_buf *out, char *msg) {
    uint32_t kind = tpr_u32(r);
    uint64_t bytes = tpr_u64(r);
    uint32_t w = tpr_u32(r), h = tpr_u32(r), ch = tpr_u32(r);
    const tcl_device *d;
    char err[TNR_ERRLEN];
    cl_mem mem = NULL;
    long i;
    NEED_END(r);
    NEED_OPEN();
    d = &ex->devs[ex->open];
    if (kind == 0) {
        if (w || h || ch) return BAD("ALLOC of a buffer: width, height and channel type must be 0");
        if (bytes == 0 || bytes > d->max_mem_alloc_bytes)
            return BAD("ALLOC of a buffer of %llu bytes: the device allows 1..%llu", (unsigned long long)bytes,
                       (unsigned long long)d->max_mem_alloc_bytes);
        if (tcl_buffer(&ex->api, ex->ctx, (size_t)bytes, &mem, err) != TNR_OK) return fail(msg, TPR_RUNTIME, "%s", err);
    } else if (kind == 1) {
        if (bytes) return BAD("ALLOC of an image: bytes must be 0");
        if (!d->image_support) return BAD("ALLOC of an image on a device without image support");
        if (ch > 1) return BAD("ALLOC of an image: channel type %u (0 float32, 1 float16)", ch);
        if (w < 1 || w > d->image2d_max_width || h < 1 || h > d->image2d_max_height)
            return BAD("ALLOC of a %ux%u image: the device allows 1..%llu x 1..%llu", w, h,
                       (unsigned long long)d->image2d_max_width, (unsigned long long)d->image2d_max_height);
        if (tcl_image(&ex->api, ex->ctx, w, h, (int)ch, &mem, err) != TNR_OK) return fail(msg, TPR_RUNTIME, "%s", err);
        bytes = (uint64_t)w * h * 4 * (ch ? 2 : 4);
    } else {
        return BAD("ALLOC of kind %u (0 buffer, 1 image)", kind);
    }
    i = grow((void **)&ex->mems, &ex->nmem, &ex->capmem, sizeof *ex->mems);
    if (i < 0) {
        ex->api.ReleaseMemObject(mem);
        return fail(msg, TPR_RUNTIME, "out of memory (memory table)");
    }
    ex->mems[i].mem = mem;
    ex->mems[i].live = 1;
    ex->mems[i].image = kind == 1;
    ex->mems[i].half = ch == 1;
    ex->mems[i].bytes = bytes;
    ex->mems[i].w = w;
    ex->mems[i].h = h;
    tpr_put_u32(out, (uint32_t)i + 1);
    return TPR_OK;
}

/* The bytes a WRITE or READ of (w, h) moves on m, or 0 with a message when the region does not fit. */
static uint64_t region_bytes(const ex_mem *m, uint32_t w, uint32_t h, uint64_t n, const char *what, char *msg) {
    if (!m->image) {
        if (w || h) return fail(msg, TPR_BAD_REQUEST, "%s of a buffer: width and height must be 0", what), 0;
        if (n > m->bytes)
            return fail(msg, TPR_BAD_REQUEST, "%s of %llu bytes into a buffer of %llu", what, (unsigned long long)n,
                        (unsigned long long)m->bytes), 0;
        return n;
    }
    if (w < 1 || h < 1 || w > m->w || h > m->h)
        return fail(msg, TPR_BAD_REQUEST, "%s of a %ux%u region of a %ux%u image", what, w, h, m->w, m->h), 0;
    if (n != (uint64_t)w * h * 4 * (m->half ? 2 : 4))
        return fail(msg, TPR_BAD_REQUEST, "%s of %llu bytes for a %ux%u RGBA %s region (%llu bytes)", what,
                    (unsigned long long)n, w, h, m->half ? "half" : "float",
                    (unsigned long long)w * h * 4 * (m->half ? 2 : 4)), 0;
    return n;
}

static int do_write(executor *ex, unsigned type, tpr_reader *r, tpr_buf *out, char *msg) {
    uint32_t h_ = tpr_u32(r), w = tpr_u32(r), h = tpr_u32(r);
    uint64_t n = 0;
    const unsigned char *data = tpr_bytes(r, &n);
    ex_mem *m;
    char err[TNR_ERRLEN];
    int rc;
    (void)out;
    NEED_END(r);
    NEED_OPEN();
    if (!(m = get_mem(ex, h_))) return BAD("WRITE to memory %u, which is not allocated (or was freed)", h_);
    msg[0] = 0;
    if (!region_bytes(m, w, h, n, "WRITE", msg) && msg[0]) return TPR_BAD_REQUEST;
    if (!n) return TPR_OK;
    rc = m->image ? tcl_write_image(&ex->api, ex->q, m->mem, 1, w, h, data, err)
                  : tcl_write_buffer(&ex->api, ex->q, m->mem, 1, 0, (size_t)n, data, err);
    return rc == TNR_OK ? TPR_OK : fail(msg, TPR_RUNTIME, "%s", err);
}

static int do_read(executor *ex, unsigned type, tpr_reader *r, tpr_buf *out, char *msg) {
    uint32_t h_ = tpr_u32(r), w = tpr_u32(r), h = tpr_u32(r);
    uint64_t n = tpr_u64(r);
    ex_mem *m;
    unsigned char *dst;
    char err[TNR_ERRLEN];
    int rc;
    NEED_END(r);
    NEED_OPEN();
    if (!(m = get_mem(ex, h_))) return BAD("READ of memory %u, which is not allocated (or was freed)", h_);
    msg[0] = 0;
    if (!region_bytes(m, w, h, n, "READ", msg) && msg[0]) return TPR_BAD_REQUEST;
    tpr_put_u64(out, n);
    if (!n) return TPR_OK;
    if (!(dst = tpr_reserve(out, (size_t)n))) return fail(msg, TPR_RUNTIME, "out of memory reading %llu bytes", (unsigned long long)n);
    rc = m->image ? tcl_read_image(&ex->api, ex->q, m->mem, 1, w, h, dst, err)
                  : tcl_read_buffer(&ex->api, ex->q, m->mem, 1, 0, (size_t)n, dst, err);
    return rc == TNR_OK ? TPR_OK : fail(msg, TPR_RUNTIME, "%s", err);
}

static int do_free(executor *ex, unsigned type, tpr_reader *r, tpr_buf *out, char *msg) {
    uint32_t kind = tpr_u32(r), h = tpr_u32(r);
    (void)out;
    NEED_END(r);
    NEED_OPEN();
    if (kind == 0) {
        ex_mem *m = get_mem(ex, h);
        if (!m) return BAD("FREE of memory %u, which is not allocated", h);
        ex->api.Finish(ex->q); /* launches already submitted may still use it */
        ex->api.ReleaseMemObject(m->mem);
        m->live = 0;
    } else if (kind == 1) {
        ex_prog *p = get_prog(ex, h);
        if (!p) return BAD("FREE of program %u, which is not built", h);
        ex->api.ReleaseProgram(p->prog); /* its kernels keep it alive in OpenCL */
        p->live = 0;
    } else if (kind == 2) {
        ex_launch *l = get_launch(ex, h);
        if (!l) return BAD("FREE of launch %u, which is not prepared", h);
        ex->api.ReleaseKernel(l->k);
        free(l->args);
        l->args = NULL;
        l->live = 0;
    } else {
        return BAD("FREE of kind %u (0 memory, 1 program, 2 launch)", kind);
    }
    return TPR_OK;
}

static int do_kernel(executor *ex, unsigned type, tpr_reader *r, tpr_buf *out, char *msg) {
    uint32_t ph = tpr_u32(r), n, i, *args = NULL, g[3], l[3];
    char *name = tpr_str(r, NULL), err[TNR_ERRLEN];
    cl_uint want = 0;
    cl_kernel k = NULL;
    ex_prog *p;
    long at;
    int status = TPR_OK, any_local = 0;
    (void)type;
    n = tpr_u32(r);
    if (!r->bad && (n > MAX_ARGS || (uint64_t)n * 4 + 24 != (uint64_t)(r->n - r->i))) {
        status = BAD("KERNEL with %u arguments: the body holds %zu bytes after the count (want %llu)", n,
                     r->n - r->i, (unsigned long long)n * 4 + 24);
        goto out;
    }
    if (!r->bad && n && !(args = malloc((size_t)n * sizeof *args))) {
        status = fail(msg, TPR_RUNTIME, "out of memory");
        goto out;
    }
    for (i = 0; i < n && !r->bad; i++) args[i] = tpr_u32(r);
    for (i = 0; i < 3; i++) g[i] = tpr_u32(r);
    for (i = 0; i < 3; i++) l[i] = tpr_u32(r);
    if (!tpr_end(r)) {
        status = BAD("KERNEL body: %s", r->why);
        goto out;
    }
    if (ex->open < 0) {
        status = BAD("KERNEL before OPEN: open a device first");
        goto out;
    }
    if (!(p = get_prog(ex, ph))) {
        status = BAD("KERNEL of program %u, which is not built (or was freed)", ph);
        goto out;
    }
    for (i = 0; i < n; i++)
        if (!get_mem(ex, args[i])) {
            status = BAD("KERNEL %s: argument %u is memory %u, which is not allocated (or was freed)", name, i, args[i]);
            goto out;
        }
    for (i = 0; i < 3; i++) {
        if (!g[i]) {
            status = BAD("KERNEL %s: global size %u x %u x %u has a zero", name, g[0], g[1], g[2]);
            goto out;
        }
        any_local |= l[i] != 0;
    }
    if (any_local)
        for (i = 0; i < 3; i++)
            if (!l[i] || g[i] % l[i]) {
                status = BAD("KERNEL %s: local size %u x %u x %u does not divide global %u x %u x %u", name, l[0], l[1],
                             l[2], g[0], g[1], g[2]);
                goto out;
            }
    if (tcl_kernel(&ex->api, p->prog, name, &k, err) != TNR_OK) {
        status = fail(msg, TPR_BAD_REQUEST, "%s", err);
        goto out;
    }
    if (tcl_kernel_num_args(&ex->api, k, &want, err) != TNR_OK) {
        status = fail(msg, TPR_RUNTIME, "%s", err);
        goto out;
    }
    if (want != n) {
        status = BAD("KERNEL %s takes %u arguments, the request gives %u", name, want, n);
        goto out;
    }
    for (i = 0; i < n; i++)
        if (tcl_set_mem_arg(&ex->api, k, i, get_mem(ex, args[i])->mem, err) != TNR_OK) {
            status = fail(msg, TPR_RUNTIME, "kernel %s: %s", name, err);
            goto out;
        }
    at = grow((void **)&ex->launches, &ex->nlaunch, &ex->caplaunch, sizeof *ex->launches);
    if (at < 0) {
        status = fail(msg, TPR_RUNTIME, "out of memory (launch table)");
        goto out;
    }
    ex->launches[at].k = k;
    ex->launches[at].live = 1;
    ex->launches[at].has_local = any_local;
    for (i = 0; i < 3; i++) {
        ex->launches[at].global[i] = g[i];
        ex->launches[at].local[i] = l[i];
    }
    ex->launches[at].nargs = n;
    ex->launches[at].args = args;
    args = NULL;
    k = NULL;
    tpr_put_u32(out, (uint32_t)at + 1);
out:
    if (k) ex->api.ReleaseKernel(k);
    free(args);
    free(name);
    return status;
}

/* Enqueues the launches in order; events (may be NULL) receive one event per launch. */
static int enqueue_all(executor *ex, ex_launch **ls, uint32_t n, cl_event *events, char *msg) {
    char err[TNR_ERRLEN];
    uint32_t i;
    for (i = 0; i < n; i++) {
        if (tcl_enqueue(&ex->api, ex->q, ls[i]->k, ls[i]->global, ls[i]->has_local ? ls[i]->local : NULL,
                        events ? &events[i] : NULL, err) != TNR_OK) {
            uint32_t j;
            ex->api.Finish(ex->q);
            if (events)
                for (j = 0; j < i; j++) ex->api.ReleaseEvent(events[j]);
            return fail(msg, TPR_RUNTIME, "launch %u of %u: %s", i + 1, n, err);
        }
    }
    return TPR_OK;
}

/* Waits for a run's launches. clFinish failing after launches means the device faulted (a kernel's wild access:
 * NVIDIA loses the queue, CL_INVALID_COMMAND_QUEUE; others say CL_OUT_OF_RESOURCES) and the context is no longer
 * usable, as when a CPU device's kernel kills its process: the executor answers CRASHED and exits after the reply;
 * the supervisor starts another, which opens the device afresh. */
static int finish_run(executor *ex, char *msg) {
    char err[TNR_ERRLEN];
    if (tcl_finish(&ex->api, ex->q, err) == TNR_OK) return TPR_OK;
    ex->lost = 1;
    return fail(msg, TPR_CRASHED, "the device faulted during the run (%s): the executor exits and the next request "
                "opens the device again; every handle is gone", err);
}

/* One timed round: the launches' summed device seconds (or each one's, into each). */
static int timed_round(executor *ex, ex_launch **ls, uint32_t n, cl_event *events, double *sum, double *each, char *msg) {
    char err[TNR_ERRLEN];
    uint32_t i;
    int rc = enqueue_all(ex, ls, n, events, msg);
    if (rc != TPR_OK) return rc;
    rc = finish_run(ex, msg);
    *sum = 0;
    for (i = 0; i < n; i++) {
        double s = 0;
        if (rc == TPR_OK && tcl_event_seconds(&ex->api, events[i], &s, err) != TNR_OK) rc = fail(msg, TPR_RUNTIME, "%s", err);
        if (each) each[i] = s;
        *sum += s;
        ex->api.ReleaseEvent(events[i]);
    }
    return rc;
}

static int do_run(executor *ex, unsigned type, tpr_reader *r, tpr_buf *out, char *msg) {
    uint32_t mode = tpr_u32(r), n = tpr_u32(r), i, warmup = 0, repeats = 0, max_runs = 0, k = 0;
    ex_launch **ls = NULL;
    cl_event *events = NULL;
    double min_s = 0, sum = 0, *costs = NULL, *each = NULL;
    size_t capcost = 0;
    int status = TPR_OK;
    (void)type;
    if (!r->bad && (n < 1 || n > MAX_LAUNCHES || (uint64_t)n * 4 > (uint64_t)(r->n - r->i)))
        return BAD("RUN of %u launches (1..%d, and the body must hold them)", n, MAX_LAUNCHES);
    if (!r->bad && !((ls = calloc(n, sizeof *ls)) && (events = calloc(n, sizeof *events)))) {
        free(ls);
        return fail(msg, TPR_RUNTIME, "out of memory");
    }
    for (i = 0; i < n && !r->bad; i++) {
        uint32_t h = tpr_u32(r);
        ls[i] = get_launch(ex, h);
        if (!r->bad && !ls[i]) {
            status = BAD("RUN of launch %u, which is not prepared (or was freed)", h);
            goto out;
        }
    }
    if (mode == TPR_RUN_TIME) {
        warmup = tpr_u32(r);
        repeats = tpr_u32(r);
        min_s = tpr_f64(r);
        max_runs = tpr_u32(r);
    }
    if (!tpr_end(r)) {
        status = BAD("RUN body: %s", r->why);
        goto out;
    }
    if (mode > TPR_RUN_TIME) {
        status = BAD("RUN mode %u (0 once, 1 profile, 2 time)", mode);
        goto out;
    }
    if (ex->open < 0) {
        status = BAD("RUN before OPEN: open a device first");
        goto out;
    }
    for (i = 0; i < n; i++) {
        uint32_t a;
        for (a = 0; a < ls[i]->nargs; a++)
            if (!get_mem(ex, ls[i]->args[a])) {
                status = BAD("RUN: launch %u uses memory %u, which was freed", i + 1, ls[i]->args[a]);
                goto out;
            }
    }
    if (mode == TPR_RUN_ONCE) {
        if ((status = enqueue_all(ex, ls, n, NULL, msg)) == TPR_OK) status = finish_run(ex, msg);
        goto out;
    }
    if (mode == TPR_RUN_PROFILE) {
        if (!(each = calloc(n, sizeof *each))) {
            status = fail(msg, TPR_RUNTIME, "out of memory");
            goto out;
        }
        if ((status = timed_round(ex, ls, n, events, &sum, each, msg)) != TPR_OK) goto out;
        tpr_put_u32(out, n);
        for (i = 0; i < n; i++) tpr_put_f64(out, each[i]);
        goto out;
    }
    if (warmup > MAX_ROUNDS || repeats > MAX_ROUNDS || max_runs > MAX_ROUNDS || !(min_s >= 0 && min_s <= 86400)) {
        status = BAD("RUN time: warmup %u, repeats %u, max runs %u (each at most %u), min seconds %g (0..86400)", warmup,
                     repeats, max_runs, MAX_ROUNDS, min_s);
        goto out;
    }
    for (i = 0; i < warmup; i++) {
        if ((status = enqueue_all(ex, ls, n, NULL, msg)) != TPR_OK) goto out;
        if ((status = finish_run(ex, msg)) != TPR_OK) goto out;
    }
    {
        double total = 0;
        while (k < repeats || (total < min_s && k < max_runs)) {
            double s;
            if (k == capcost) {
                size_t c = capcost ? capcost * 2 : 16;
                double *t = realloc(costs, c * sizeof *costs);
                if (!t) {
                    status = fail(msg, TPR_RUNTIME, "out of memory");
                    goto out;
                }
                costs = t;
                capcost = c;
            }
            if ((status = timed_round(ex, ls, n, events, &s, NULL, msg)) != TPR_OK) goto out;
            costs[k++] = s;
            total += s;
        }
    }
    tpr_put_u32(out, k);
    for (i = 0; i < k; i++) tpr_put_f64(out, costs[i]);
out:
    free(ls);
    free(events);
    free(costs);
    free(each);
    return status;
}

static int dispatch(executor *ex, unsigned type, tpr_reader *r, tpr_buf *out, char *msg) {
    switch (type) {
    case TPR_HELLO: return do_hello(ex, type, r, out, msg);
    case TPR_OPEN: return do_open(ex, type, r, out, msg);
    case TPR_BUILD: return do_build(ex, type, r, out, msg);
    case TPR_ALLOC: return do_alloc(ex, type, r, out, msg);
    case TPR_WRITE: return do_write(ex, type, r, out, msg);
    case TPR_READ: return do_read(ex, type, r, out, msg);
    case TPR_FREE: return do_free(ex, type, r, out, msg);
    case TPR_KERNEL: return do_kernel(ex, type, r, out, msg);
    case TPR_RUN: return do_run(ex, type, r, out, msg);
    case TPR_RESET:
        NEED_END(r);
        release_all(ex);
        return TPR_OK;
    case TPR_PING:
    case TPR_BYE: NEED_END(r); return TPR_OK;
    default: return BAD("unknown message type %u", type);
    }
}

void tnr_agent_executor(int fd, const char *work_folder) {
    executor ex;
    unsigned char head[TPR_HEADER], *body = NULL;
    memset(&ex, 0, sizeof ex);
    ex.open = -1;
    work_dir = work_folder ? work_folder : "";
    for (;;) {
        tpr_header h;
        tpr_reader r;
        tpr_buf out = {0};
        char msg[TNR_ERRLEN];
        int status, rc;
        if (tpr_read_full(fd, head, TPR_HEADER) != 0) break;
        tpr_unpack_header(head, &h);
        if (tpr_header_problem(&h)) break; /* the supervisor checks headers: this is not it */
        body = malloc(h.len ? (size_t)h.len : 1);
        if (!body || tpr_read_full(fd, body, (size_t)h.len) != 0) break;
        tpr_reader_init(&r, body, (size_t)h.len);
        msg[0] = 0;
        status = dispatch(&ex, h.type, &r, &out, msg);
        if (status == TPR_OK && out.oom) status = fail(msg, TPR_RUNTIME, "out of memory for the reply");
        if (status != TPR_OK) {
            if (status != TPR_COMPILE)
                ex_log("%s (request %u): %s: %s", tpr_type_name(h.type), h.rid, tpr_status_name((unsigned)status), msg);
            rc = tpr_send_error(fd, h.type, h.rid, (unsigned)status, msg);
        } else {
            rc = tpr_send(fd, h.type, h.rid, TPR_OK, out.p, out.n);
        }
        tpr_buf_free(&out);
        free(body);
        body = NULL;
        if (rc != 0 || ex.lost) break;
    }
    free(body);
    shutdown_executor(&ex);
}
