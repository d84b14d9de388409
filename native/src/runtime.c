#define _POSIX_C_SOURCE 200809L
#include "runtime.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bincache.h"
#include "common.h"
#include "half.h"
#include "sha256.h"

struct tnr_runtime {
    tnr_artifact *a;
    tcl_api api;
    tcl_device dev;
    cl_context ctx;
    cl_command_queue q, pq; /* the run queue; a profiling queue made by the first tnr_profile */
    cl_mem *pools, *params, *workspaces;
    cl_program *programs; /* per source */
    int ncalls;
    cl_kernel *kernels; /* per call, in run order, arguments set */
    int *call_node;
    size_t (*global)[3], (*local)[3];
    void **in_stage, **out_stage; /* device-format bytes of each input and output */
    cl_mem *in_pin, *out_pin;      /* the mapped buffers behind them where the driver pins host memory, else NULL */
    int pinned;                    /* how many of the stages are pinned */
    int *in_set;
    int ran;
    int from_source, from_binary;
    int verified; /* opened by tnr_open_verified (binaries come from this user's own cache for every run) */
    char cache_key[160];
    char device_label[600];
    char err[TNR_ERRLEN];
};

static _Thread_local char open_error[TNR_ERRLEN];

const char *tnr_open_error(void) { return open_error; }
const char *tnr_last_error(const tnr_runtime *rt) { return rt ? rt->err : open_error; }

const char *tnr_code_name(int code) {
    static const char *names[] = {"ok", "argument", "io", "artifact", "opencl", "device", "build", "memory", "state"};
    return code >= 0 && code <= TNR_E_STATE ? names[code] : "unknown";
}

/* ---- devices ---- */

static int rank(const tcl_device *d) {
    return strcmp(d->type, "GPU") == 0 ? 0 : strcmp(d->platform_tag, "pocl") == 0 ? 1 : strcmp(d->type, "CPU") == 0 ? 2 : 3;
}

static void device_table(const tcl_device *devs, int n, char *out, size_t len) {
    size_t used = 0;
    int i;
    out[0] = 0;
    for (i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "\n  [%d] %s / %s (%s) %s", devs[i].index, devs[i].platform_name,
                                 devs[i].name, devs[i].type, devs[i].fingerprint);
}

int tnr_choose_device(const tcl_device *devs, int n, const char *spec, const tnr_artifact *a, char *err) {
    char table[1200];
    int i, best = -1;
    const char *s = spec;
    while (s && isspace((unsigned char)*s)) s++;
    if (s && *s) {
        const char *q = s;
        while (*q && isdigit((unsigned char)*q)) q++;
        while (*q && isspace((unsigned char)*q)) q++;
        if (!*q) {
            long idx = strtol(s, NULL, 10);
            if (idx >= 0 && idx < n) return (int)idx;
            device_table(devs, n, table, sizeof table);
            return tnr_fail(err, TNR_E_DEVICE, "no OpenCL device with index %s; available devices:%s", s, table), -1;
        }
        for (i = 0; i < n; i++)
            if (tcl_device_matches(&devs[i], s)) return i;
        device_table(devs, n, table, sizeof table);
        return tnr_fail(err, TNR_E_DEVICE, "no OpenCL device matches '%.100s'; available devices:%s", s, table), -1;
    }
    if (a && a->dev_name && a->dev_platform) {
        for (i = 0; i < n; i++)
            if (strcmp(devs[i].platform_name, a->dev_platform) == 0 && strcmp(devs[i].name, a->dev_name) == 0 &&
                (!a->dev_driver || strcmp(devs[i].driver_version, a->dev_driver) == 0))
                return i;
    }
    if (a && a->dev_fingerprint)
        for (i = 0; i < n; i++)
            if (strcmp(devs[i].fingerprint, a->dev_fingerprint) == 0) return i;
    for (i = 0; i < n; i++)
        if (!tcl_is_simulator(&devs[i]) && (best < 0 || rank(&devs[i]) < rank(&devs[best]))) best = i;
    if (best < 0) {
        device_table(devs, n, table, sizeof table);
        return tnr_fail(err, TNR_E_DEVICE, "no OpenCL device but a simulator; name one to use it:%s", table), -1;
    }
    return best;
}

int tnr_list_devices(char *out, size_t len, char *err, size_t errlen) {
    tcl_api api;
    tcl_device *devs = NULL;
    int n = 0, rc, i;
    size_t used = 0;
    char e[TNR_ERRLEN];
    if (!out || !len) return TNR_E_ARG;
    out[0] = 0;
    rc = tcl_load(&api, e);
    if (!rc) {
        rc = tcl_list_devices(&api, &devs, &n, e);
        for (i = 0; !rc && i < n && used < len; i++)
            used += (size_t)snprintf(out + used, len - used, "%d\t%s\t%s\t%s\t%s\t%s\n", i, devs[i].platform_name,
                                     devs[i].name, devs[i].type, devs[i].fingerprint, devs[i].driver_version);
        free(devs);
        tcl_unload(&api);
    }
    if (rc && err && errlen) snprintf(err, errlen, "%s", e);
    return rc;
}

int tnr_check(const char *dir, char *err, size_t errlen) {
    tnr_artifact *a = NULL;
    char e[TNR_ERRLEN];
    int rc;
    if (!dir) return TNR_E_ARG;
    rc = tnr_artifact_load(dir, &a, e);
    if (rc && err && errlen) snprintf(err, errlen, "%s", e);
    tnr_artifact_free(a);
    return rc;
}

int tnr_verify_signature(const char *dir, const char *key_file, char *err, size_t errlen) {
    char e[TNR_ERRLEN];
    unsigned char *key = NULL;
    size_t keylen = 0;
    int rc;
    if (!dir || !key_file) return TNR_E_ARG;
    rc = tnr_read_key(key_file, &key, &keylen, e);
    if (!rc) rc = tnr_artifact_verify_only(dir, key, keylen, e);
    if (key) memset(key, 0, keylen);
    free(key);
    if (rc && err && errlen) snprintf(err, errlen, "%s", e);
    return rc;
}

/* ---- the binary cache ---- */

/* The folder of the binary cache: this user's own, $TUNER_CACHE_DIR/binaries/<device>, else
 * $XDG_CACHE_HOME/tuner/binaries/<device>, else ~/.cache/tuner/binaries/<device> (each only when absolute), as
 * tuner.artifact.cache resolves it; never the artifact's folder, which running leaves untouched (a read-only, shared
 * or signed artifact runs unchanged). Files are keyed by the source's hash, so a verified run's binaries are built
 * from the verified source. 0: no cache. */
static int cache_dir(const tnr_runtime *rt, char *dir, size_t n) {
    const char *t = getenv("TUNER_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    size_t used;
    if (t && t[0] == '/') used = (size_t)snprintf(dir, n, "%s/binaries/%s", t, rt->cache_key);
    else if (x && x[0] == '/') used = (size_t)snprintf(dir, n, "%s/tuner/binaries/%s", x, rt->cache_key);
    else if (h && h[0] == '/') used = (size_t)snprintf(dir, n, "%s/.cache/tuner/binaries/%s", h, rt->cache_key);
    else return 0;
    return used < n;
}

static int build_program(tnr_runtime *rt, const tnr_source *src, cl_program *prog) {
    char dir[4096], path[4200], tag[300];
    unsigned char *bin = NULL;
    size_t len = 0;
    int rc, cached = cache_dir(rt, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/%s.bin", dir, src->sha256);
    snprintf(tag, sizeof tag, "%s/%s", rt->cache_key, src->sha256);
    if (cached) bin = tnr_bincache_read(dir, path, tag, &len);
    if (bin) {
        rc = tcl_build_binary(&rt->api, rt->ctx, &rt->dev, bin, len, "", prog, rt->err);
        free(bin);
        if (rc == TNR_OK) {
            rt->from_binary++;
            return TNR_OK;
        } /* refused (another driver build, a damaged file): build from source and rewrite it */
    }
    rc = tcl_build_source(&rt->api, rt->ctx, &rt->dev, src->text, src->len, "", prog, rt->err);
    if (rc) {
        tnr_prefix(rt->err, "%s/%s", rt->a->dir, src->path);
        return rc;
    }
    rt->from_source++;
    if (cached && tcl_program_binary(&rt->api, *prog, &bin, &len, rt->err) == TNR_OK && bin && len)
        tnr_bincache_write(dir, path, tag, bin, len);
    free(bin);
    rt->err[0] = 0;
    return TNR_OK;
}

/* ---- open and close ---- */

static int alloc_blob(tnr_runtime *rt, const tnr_blob *b, cl_mem *mem) {
    if (b->texture) return tcl_image(&rt->api, rt->ctx, (size_t)b->phys[1], (size_t)b->phys[0], b->dtype == TNR_F16, mem, rt->err);
    return tcl_buffer(&rt->api, rt->ctx, (size_t)(b->elems * tnr_dtype_size(b->dtype)), mem, rt->err);
}

/* Staging memory for one input or output: pinned where the driver offers it (the copies then move at the bus's
 * speed, with no bounce through a driver buffer), unless TUNER_RUN_PINNED=0; else ordinary memory. */
static int stage(tnr_runtime *rt, const tnr_entry *e, cl_mem *pin, void **host) {
    size_t bytes = (size_t)e->elems * tnr_dtype_size(e->dtype);
    const char *env = getenv("TUNER_RUN_PINNED");
    if (!(env && strcmp(env, "0") == 0)) tcl_pinned(&rt->api, rt->ctx, rt->q, bytes, pin, host);
    if (*host) {
        memset(*host, 0, bytes);
        rt->pinned++;
        return TNR_OK;
    }
    if (!(*host = calloc(bytes ? bytes : 1, 1))) return tnr_fail(rt->err, TNR_E_NOMEM, "out of memory");
    return TNR_OK;
}

static int setup(tnr_runtime *rt, const char *spec) {
    tnr_artifact *a = rt->a;
    tcl_device *devs = NULL;
    int n = 0, rc, i, j, k, c;
    tnr_limits lim;
    rc = tcl_load(&rt->api, rt->err);
    if (rc) return rc;
    rc = tcl_list_devices(&rt->api, &devs, &n, rt->err);
    if (rc) return rc;
    i = tnr_choose_device(devs, n, spec, a, rt->err);
    if (i < 0) {
        free(devs);
        return TNR_E_DEVICE;
    }
    rt->dev = devs[i];
    free(devs);
    snprintf(rt->device_label, sizeof rt->device_label, "%s / %s", rt->dev.platform_name, rt->dev.name);
    tnr_binary_cache_key(&rt->dev, rt->cache_key, sizeof rt->cache_key);
    /* checks 4 and 9 against the device it runs on */
    lim.image2d_max_width = rt->dev.image_support ? rt->dev.image2d_max_width : 0;
    lim.image2d_max_height = rt->dev.image_support ? rt->dev.image2d_max_height : 0;
    lim.max_work_group_size = rt->dev.max_work_group_size;
    for (k = 0; k < 3; k++) lim.max_work_item_sizes[k] = rt->dev.max_work_item_sizes[k];
    lim.max_mem_alloc_bytes = rt->dev.max_mem_alloc_bytes;
    rc = tnr_artifact_check_limits(a, &lim, rt->dev.name, rt->err);
    if (rc) {
        tnr_prefix(rt->err, "does not fit the device it runs on");
        return rc;
    }
    if ((rc = tcl_context(&rt->api, &rt->dev, &rt->ctx, rt->err)) ||
        (rc = tcl_queue(&rt->api, rt->ctx, &rt->dev, 0, &rt->q, rt->err)))
        return rc;
    /* memory */
    rt->pools = calloc((size_t)a->npools + 1, sizeof(cl_mem));
    rt->params = calloc((size_t)a->nparams + 1, sizeof(cl_mem));
    rt->workspaces = calloc((size_t)a->nworkspaces + 1, sizeof(cl_mem));
    rt->programs = calloc((size_t)a->nsources + 1, sizeof(cl_program));
    if (!rt->pools || !rt->params || !rt->workspaces || !rt->programs) return tnr_fail(rt->err, TNR_E_NOMEM, "out of memory");
    for (i = 0; i < a->npools; i++) {
        const tnr_pool *p = &a->pools[i];
        rc = p->texture ? tcl_image(&rt->api, rt->ctx, (size_t)p->shape[1], (size_t)p->shape[0], p->dtype == TNR_F16,
                                    &rt->pools[i], rt->err)
                        : tcl_buffer(&rt->api, rt->ctx, (size_t)p->shape[0], &rt->pools[i], rt->err);
        if (rc) {
            tnr_prefix(rt->err, "pool %lld", (long long)p->id);
            return rc;
        }
    }
    for (i = 0; i < a->nparams; i++) {
        const tnr_blob *b = &a->params[i];
        const unsigned char *bytes = a->params_bin + b->offset;
        if ((rc = alloc_blob(rt, b, &rt->params[i]))) return rc;
        rc = b->texture ? tcl_write_image(&rt->api, rt->q, rt->params[i], 0, (size_t)b->phys[1], (size_t)b->phys[0], bytes, rt->err)
                        : tcl_write_buffer(&rt->api, rt->q, rt->params[i], 0, 0, (size_t)b->nbytes, bytes, rt->err);
        if (rc) {
            tnr_prefix(rt->err, "param '%.80s'", b->key);
            return rc;
        }
    }
    for (i = 0; i < a->nworkspaces; i++) {
        const tnr_blob *b = &a->workspaces[i];
        if ((rc = alloc_blob(rt, b, &rt->workspaces[i]))) return rc;
        if (b->dtype == TNR_I32) { /* counters start at zero, and each launch leaves them so (docs/artifact.md) */
            size_t bytes = (size_t)b->elems * 4;
            void *zeros = calloc(bytes ? bytes : 1, 1);
            if (!zeros) return tnr_fail(rt->err, TNR_E_NOMEM, "out of memory");
            rc = tcl_write_buffer(&rt->api, rt->q, rt->workspaces[i], 1, 0, bytes, zeros, rt->err);
            free(zeros);
            if (rc) {
                tnr_prefix(rt->err, "workspace '%.80s'", b->key);
                return rc;
            }
        }
    }
    /* programs */
    for (i = 0; i < a->nnodes; i++) {
        int s = a->nodes[i].source_index;
        if (!rt->programs[s] && (rc = build_program(rt, &a->sources[s], &rt->programs[s]))) return rc;
    }
    /* kernels, arguments set once */
    for (i = 0; i < a->nnodes; i++) rt->ncalls += a->nodes[i].ncalls;
    rt->kernels = calloc((size_t)rt->ncalls + 1, sizeof(cl_kernel));
    rt->call_node = calloc((size_t)rt->ncalls + 1, sizeof(int));
    rt->global = calloc((size_t)rt->ncalls + 1, sizeof *rt->global);
    rt->local = calloc((size_t)rt->ncalls + 1, sizeof *rt->local);
    if (!rt->kernels || !rt->call_node || !rt->global || !rt->local) return tnr_fail(rt->err, TNR_E_NOMEM, "out of memory");
    for (i = 0, c = 0; i < a->nnodes; i++) {
        const tnr_node *node = &a->nodes[i];
        for (j = 0; j < node->ncalls; j++, c++) {
            const tnr_call *call = &node->calls[j];
            cl_uint nargs = 0;
            rt->call_node[c] = i;
            for (k = 0; k < 3; k++) {
                rt->global[c][k] = (size_t)call->global[k];
                rt->local[c][k] = (size_t)call->local[k];
            }
            rc = tcl_kernel(&rt->api, rt->programs[node->source_index], call->kernel, &rt->kernels[c], rt->err);
            if (!rc) rc = tcl_kernel_num_args(&rt->api, rt->kernels[c], &nargs, rt->err);
            if (!rc && (int)nargs != call->nargs)
                rc = tnr_fail(rt->err, TNR_E_ARTIFACT, "%s/graph.json: nodes[%d] ('%.80s').calls[%d]: kernel '%.80s' takes %u "
                              "arguments, the call gives %d; recompile the model", a->dir, i, node->name, j, call->kernel,
                              nargs, call->nargs);
            for (k = 0; !rc && k < call->nargs; k++) {
                const tnr_arg *arg = &call->args[k];
                cl_mem m = arg->kind == TNR_ARG_ENTRY   ? rt->pools[a->entries[arg->index].pool]
                           : arg->kind == TNR_ARG_PARAM ? rt->params[arg->index]
                                                        : rt->workspaces[arg->index];
                rc = tcl_set_mem_arg(&rt->api, rt->kernels[c], (cl_uint)k, m, rt->err);
            }
            if (rc) {
                if (rc != TNR_E_ARTIFACT)
                    tnr_prefix(rt->err, "nodes[%d] ('%.80s').calls[%d] (%s, %s)", i, node->name, j, call->kernel,
                               a->sources[node->source_index].path);
                return rc;
            }
        }
    }
    /* staging for inputs and outputs */
    rt->in_stage = calloc((size_t)a->ninputs + 1, sizeof(void *));
    rt->in_pin = calloc((size_t)a->ninputs + 1, sizeof(cl_mem));
    rt->in_set = calloc((size_t)a->ninputs + 1, sizeof(int));
    rt->out_stage = calloc((size_t)a->noutputs + 1, sizeof(void *));
    rt->out_pin = calloc((size_t)a->noutputs + 1, sizeof(cl_mem));
    if (!rt->in_stage || !rt->in_pin || !rt->in_set || !rt->out_stage || !rt->out_pin)
        return tnr_fail(rt->err, TNR_E_NOMEM, "out of memory");
    for (i = 0; i < a->ninputs; i++)
        if ((rc = stage(rt, &a->entries[a->inputs[i]], &rt->in_pin[i], &rt->in_stage[i]))) return rc;
    for (i = 0; i < a->noutputs; i++)
        if ((rc = stage(rt, &a->entries[a->outputs[i]], &rt->out_pin[i], &rt->out_stage[i]))) return rc;
    /* the params are on the device: their host copy is no longer needed */
    if ((rc = tcl_finish(&rt->api, rt->q, rt->err))) return rc;
    free(a->params_bin);
    a->params_bin = NULL;
    return TNR_OK;
}

static int open_with(const char *dir, const char *device, const char *key_file, tnr_runtime **out) {
    tnr_runtime *rt;
    unsigned char *key = NULL;
    size_t keylen = 0;
    int rc;
    open_error[0] = 0;
    if (!out) return tnr_fail(open_error, TNR_E_ARG, "tnr_open: rt is NULL");
    *out = NULL;
    if (!dir) return tnr_fail(open_error, TNR_E_ARG, "tnr_open: dir is NULL");
    rt = calloc(1, sizeof *rt);
    if (!rt) return tnr_fail(open_error, TNR_E_NOMEM, "out of memory");
    if (key_file) {
        rc = tnr_read_key(key_file, &key, &keylen, rt->err);
        rt->verified = 1;
        if (!rc) rc = tnr_artifact_load_key(dir, key, keylen, &rt->a, rt->err);
        if (key) memset(key, 0, keylen);
        free(key);
    } else {
        rc = tnr_artifact_load(dir, &rt->a, rt->err);
    }
    if (!rc) rc = setup(rt, device);
    if (rc) {
        snprintf(open_error, sizeof open_error, "%s", rt->err);
        tnr_close(rt);
        return rc;
    }
    *out = rt;
    return TNR_OK;
}

int tnr_open(const char *dir, const char *device, tnr_runtime **out) { return open_with(dir, device, NULL, out); }

int tnr_open_verified(const char *dir, const char *device, const char *key_file, tnr_runtime **out) {
    if (!key_file) {
        if (out) *out = NULL;
        return tnr_fail(open_error, TNR_E_ARG, "tnr_open_verified: key_file is NULL");
    }
    return open_with(dir, device, key_file, out);
}

void tnr_close(tnr_runtime *rt) {
    int i;
    if (!rt) return;
    if (rt->q) rt->api.Finish(rt->q);
    if (rt->pq) rt->api.Finish(rt->pq);
    /* the pinned stages are unmapped on the run queue: before it goes */
    for (i = 0; rt->in_stage && i < rt->a->ninputs; i++) {
        if (rt->in_pin && rt->in_pin[i]) tcl_pinned_free(&rt->api, rt->q, rt->in_pin[i], rt->in_stage[i]);
        else free(rt->in_stage[i]);
    }
    for (i = 0; rt->out_stage && i < rt->a->noutputs; i++) {
        if (rt->out_pin && rt->out_pin[i]) tcl_pinned_free(&rt->api, rt->q, rt->out_pin[i], rt->out_stage[i]);
        else free(rt->out_stage[i]);
    }
    free(rt->in_stage), free(rt->in_set), free(rt->out_stage), free(rt->in_pin), free(rt->out_pin);
    for (i = 0; rt->kernels && i < rt->ncalls; i++)
        if (rt->kernels[i]) rt->api.ReleaseKernel(rt->kernels[i]);
    for (i = 0; rt->programs && i < rt->a->nsources; i++)
        if (rt->programs[i]) rt->api.ReleaseProgram(rt->programs[i]);
    for (i = 0; rt->pools && i < rt->a->npools; i++)
        if (rt->pools[i]) rt->api.ReleaseMemObject(rt->pools[i]);
    for (i = 0; rt->params && i < rt->a->nparams; i++)
        if (rt->params[i]) rt->api.ReleaseMemObject(rt->params[i]);
    for (i = 0; rt->workspaces && i < rt->a->nworkspaces; i++)
        if (rt->workspaces[i]) rt->api.ReleaseMemObject(rt->workspaces[i]);
    if (rt->pq) rt->api.ReleaseCommandQueue(rt->pq);
    if (rt->q) rt->api.ReleaseCommandQueue(rt->q);
    if (rt->ctx) rt->api.ReleaseContext(rt->ctx);
    free(rt->kernels), free(rt->call_node), free(rt->global), free(rt->local);
    free(rt->programs), free(rt->pools), free(rt->params), free(rt->workspaces);
    /* The OpenCL library stays loaded: drivers keep threads and atexit handlers that must not outlive their code. */
    tnr_artifact_free(rt->a);
    free(rt);
}

/* ---- describing ---- */

int tnr_num_inputs(const tnr_runtime *rt) { return rt ? rt->a->ninputs : 0; }
int tnr_num_outputs(const tnr_runtime *rt) { return rt ? rt->a->noutputs : 0; }
const char *tnr_input_name(const tnr_runtime *rt, int i) {
    return rt && i >= 0 && i < rt->a->ninputs ? rt->a->entries[rt->a->inputs[i]].name : NULL;
}
const char *tnr_output_name(const tnr_runtime *rt, int i) {
    return rt && i >= 0 && i < rt->a->noutputs ? rt->a->entries[rt->a->outputs[i]].name : NULL;
}
static int shape_of(const tnr_entry *e, int64_t *dims) {
    int k;
    for (k = 0; k < e->ndim; k++) dims[k] = e->shape[k];
    return e->ndim;
}
int tnr_input_shape(const tnr_runtime *rt, int i, int64_t *dims) {
    return rt && dims && i >= 0 && i < rt->a->ninputs ? shape_of(&rt->a->entries[rt->a->inputs[i]], dims) : -1;
}
int tnr_output_shape(const tnr_runtime *rt, int i, int64_t *dims) {
    return rt && dims && i >= 0 && i < rt->a->noutputs ? shape_of(&rt->a->entries[rt->a->outputs[i]], dims) : -1;
}
const char *tnr_dtype(const tnr_runtime *rt) { return rt && rt->a->dtype == TNR_F16 ? "float16" : "float32"; }
const char *tnr_device_name(const tnr_runtime *rt) { return rt ? rt->device_label : ""; }
const char *tnr_device_fingerprint(const tnr_runtime *rt) { return rt ? rt->dev.fingerprint : ""; }
int tnr_pinned_stages(const tnr_runtime *rt) { return rt ? rt->pinned : 0; }
void tnr_build_stats(const tnr_runtime *rt, int *from_source, int *from_binary) {
    if (from_source) *from_source = rt ? rt->from_source : 0;
    if (from_binary) *from_binary = rt ? rt->from_binary : 0;
}
int tnr_num_nodes(const tnr_runtime *rt) { return rt ? rt->a->nnodes : 0; }
const char *tnr_node_name(const tnr_runtime *rt, int i) { return rt && i >= 0 && i < rt->a->nnodes ? rt->a->nodes[i].name : NULL; }
const char *tnr_node_op(const tnr_runtime *rt, int i) { return rt && i >= 0 && i < rt->a->nnodes ? rt->a->nodes[i].op : NULL; }
const char *tnr_node_template(const tnr_runtime *rt, int i) {
    return rt && i >= 0 && i < rt->a->nnodes ? (rt->a->nodes[i].template_name ? rt->a->nodes[i].template_name : "") : NULL;
}
double tnr_node_flops(const tnr_runtime *rt, int i) { return rt && i >= 0 && i < rt->a->nnodes ? rt->a->nodes[i].flops : 0; }

int tnr_node_tuned(const tnr_runtime *rt, int i) { return rt && i >= 0 && i < rt->a->nnodes ? rt->a->nodes[i].tuned : 0; }

const char *tnr_node_config_source(const tnr_runtime *rt, int i) {
    const tnr_node *n;
    if (!rt || i < 0 || i >= rt->a->nnodes) return NULL;
    n = &rt->a->nodes[i];
    if (!n->template_name) return "";
    return n->config_source ? n->config_source : n->tuned ? "tuned" : "fallback";
}

const char *tnr_node_storage(const tnr_runtime *rt, int i) {
    int j, k, tex = 0, buf = 0;
    if (!rt || i < 0 || i >= rt->a->nnodes) return NULL;
    for (j = 0; j < rt->a->nodes[i].ncalls; j++) {
        const tnr_call *c = &rt->a->nodes[i].calls[j];
        for (k = 0; k < c->nargs; k++) {
            if (c->args[k].image) tex = 1;
            else buf = 1;
        }
    }
    return tex && buf ? "mixed" : tex ? "texture" : buf ? "buffer" : "";
}

/* ---- running ---- */

int tnr_set_input(tnr_runtime *rt, int i, const float *data, size_t n) {
    const tnr_entry *e;
    if (!rt) return TNR_E_ARG;
    if (i < 0 || i >= rt->a->ninputs)
        return tnr_fail(rt->err, TNR_E_ARG, "no input %d: the model takes %d", i, rt->a->ninputs);
    e = &rt->a->entries[rt->a->inputs[i]];
    if (!data) return tnr_fail(rt->err, TNR_E_ARG, "input %d ('%.80s'): data is NULL", i, e->name);
    if (n != e->elems)
        return tnr_fail(rt->err, TNR_E_ARG, "input %d ('%.80s') takes %llu values, got %zu", i, e->name,
                        (unsigned long long)e->elems, n);
    if (e->dtype == TNR_F16) tnr_floats_to_halves(data, rt->in_stage[i], n);
    else memcpy(rt->in_stage[i], data, n * sizeof(float));
    rt->in_set[i] = 1;
    return TNR_OK;
}

/* Inputs written, every call enqueued, outputs read: all on q, one wait at the end. */
static int run_on(tnr_runtime *rt, cl_command_queue q, cl_event *events) {
    const tnr_artifact *a = rt->a;
    int i, rc = TNR_OK;
    for (i = 0; i < a->ninputs; i++) {
        const tnr_entry *e = &a->entries[a->inputs[i]];
        if (!rt->in_set[i])
            return tnr_fail(rt->err, TNR_E_STATE, "input %d ('%.80s') was never set (tnr_set_input)", i, e->name);
        rc = tcl_write_buffer(&rt->api, q, rt->pools[e->pool], 0, 0, (size_t)e->elems * tnr_dtype_size(e->dtype),
                              rt->in_stage[i], rt->err);
        if (rc) return rc;
    }
    for (i = 0; i < rt->ncalls; i++) {
        rc = tcl_enqueue(&rt->api, q, rt->kernels[i], rt->global[i], rt->local[i], events ? &events[i] : NULL, rt->err);
        if (rc) {
            const tnr_node *n = &a->nodes[rt->call_node[i]];
            tnr_prefix(rt->err, "node '%.80s' (%s)", n->name, a->sources[n->source_index].path);
            if (events)
                while (i-- > 0) rt->api.ReleaseEvent(events[i]);
            tcl_finish(&rt->api, q, NULL);
            return rc;
        }
    }
    for (i = 0; i < a->noutputs; i++) {
        const tnr_entry *e = &a->entries[a->outputs[i]];
        rc = tcl_read_buffer(&rt->api, q, rt->pools[e->pool], 0, 0, (size_t)e->elems * tnr_dtype_size(e->dtype),
                             rt->out_stage[i], rt->err);
        if (rc) break;
    }
    if (!rc) rc = tcl_finish(&rt->api, q, rt->err);
    else tcl_finish(&rt->api, q, NULL);
    if (rc && events)
        for (i = 0; i < rt->ncalls; i++) rt->api.ReleaseEvent(events[i]);
    if (!rc) rt->ran = 1;
    return rc;
}

int tnr_run(tnr_runtime *rt) {
    if (!rt) return TNR_E_ARG;
    return run_on(rt, rt->q, NULL);
}

int tnr_get_output(tnr_runtime *rt, int i, float *data, size_t n) {
    const tnr_entry *e;
    if (!rt) return TNR_E_ARG;
    if (i < 0 || i >= rt->a->noutputs)
        return tnr_fail(rt->err, TNR_E_ARG, "no output %d: the model returns %d", i, rt->a->noutputs);
    e = &rt->a->entries[rt->a->outputs[i]];
    if (!data) return tnr_fail(rt->err, TNR_E_ARG, "output %d ('%.80s'): data is NULL", i, e->name);
    if (n != e->elems)
        return tnr_fail(rt->err, TNR_E_ARG, "output %d ('%.80s') holds %llu values, asked for %zu", i, e->name,
                        (unsigned long long)e->elems, n);
    if (!rt->ran) return tnr_fail(rt->err, TNR_E_STATE, "no run yet (tnr_run)");
    if (e->dtype == TNR_F16) tnr_halves_to_floats(rt->out_stage[i], data, n);
    else memcpy(data, rt->out_stage[i], n * sizeof(float));
    return TNR_OK;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tnr_time(tnr_runtime *rt, int warmup, int repeats, double *seconds) {
    int i, rc;
    if (!rt) return TNR_E_ARG;
    if (warmup < 0 || repeats < 1 || !seconds)
        return tnr_fail(rt->err, TNR_E_ARG, "tnr_time: warmup >= 0, repeats >= 1 and seconds[repeats] needed");
    for (i = 0; i < warmup; i++)
        if ((rc = run_on(rt, rt->q, NULL))) return rc;
    for (i = 0; i < repeats; i++) {
        double t0 = now();
        if ((rc = run_on(rt, rt->q, NULL))) return rc;
        seconds[i] = now() - t0;
    }
    return TNR_OK;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int tnr_profile(tnr_runtime *rt, int repeats, double *node_seconds) {
    int r, i, rc = TNR_OK, nn;
    cl_event *events;
    double *per; /* [repeats][nodes] */
    if (!rt) return TNR_E_ARG;
    nn = rt->a->nnodes;
    if (repeats < 1 || !node_seconds) return tnr_fail(rt->err, TNR_E_ARG, "tnr_profile: repeats >= 1 and node_seconds needed");
    if (!rt->pq && (rc = tcl_queue(&rt->api, rt->ctx, &rt->dev, 1, &rt->pq, rt->err))) return rc;
    events = calloc((size_t)rt->ncalls + 1, sizeof *events);
    per = calloc((size_t)repeats * (size_t)nn + 1, sizeof *per);
    if (!events || !per) {
        free(events);
        free(per);
        return tnr_fail(rt->err, TNR_E_NOMEM, "out of memory");
    }
    rc = run_on(rt, rt->pq, NULL); /* warm-up */
    for (r = 0; !rc && r < repeats; r++) {
        if ((rc = run_on(rt, rt->pq, events))) break;
        for (i = 0; i < rt->ncalls; i++) {
            double s = 0;
            if (!rc) rc = tcl_event_seconds(&rt->api, events[i], &s, rt->err);
            per[(size_t)r * (size_t)nn + (size_t)rt->call_node[i]] += s;
            rt->api.ReleaseEvent(events[i]);
        }
    }
    if (!rc) {
        double *col = malloc((size_t)repeats * sizeof *col);
        if (!col) rc = tnr_fail(rt->err, TNR_E_NOMEM, "out of memory");
        for (i = 0; col && i < nn; i++) {
            for (r = 0; r < repeats; r++) col[r] = per[(size_t)r * (size_t)nn + (size_t)i];
            qsort(col, (size_t)repeats, sizeof *col, cmp_double);
            node_seconds[i] = repeats % 2 ? col[repeats / 2] : (col[repeats / 2 - 1] + col[repeats / 2]) / 2;
        }
        free(col);
    }
    free(events);
    free(per);
    return rc;
}
