#define _POSIX_C_SOURCE 200809L
#include "opencl.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "sha256.h"

const char *const tcl_default_paths[] = {
    "libOpenCL.so.1",
    "libOpenCL.so",
    "/system/vendor/lib64/libOpenCL.so",
    "/vendor/lib64/libOpenCL.so",
    "/system/lib64/libOpenCL.so",
    "/system/vendor/lib64/egl/libGLES_mali.so",
    "/vendor/lib64/egl/libGLES_mali.so",
    "libOpenCL-pixel.so",
    "/system/vendor/lib64/libOpenCL-pixel.so",
    "/vendor/lib64/libOpenCL-pixel.so",
    "/system/vendor/lib/libOpenCL.so",
    "/vendor/lib/libOpenCL.so",
    "/system/lib/libOpenCL.so",
    NULL};

#define REQ(field, sym) {#sym, offsetof(tcl_api, field), 1}
#define OPT(field, sym) {#sym, offsetof(tcl_api, field), 0}
static const struct {
    const char *symbol;
    size_t offset;
    int required;
} SYMBOLS[] = {
    REQ(GetPlatformIDs, clGetPlatformIDs),
    REQ(GetPlatformInfo, clGetPlatformInfo),
    REQ(GetDeviceIDs, clGetDeviceIDs),
    REQ(GetDeviceInfo, clGetDeviceInfo),
    REQ(CreateContext, clCreateContext),
    REQ(ReleaseContext, clReleaseContext),
    OPT(CreateCommandQueue, clCreateCommandQueue),
    OPT(CreateCommandQueueWithProperties, clCreateCommandQueueWithProperties),
    REQ(ReleaseCommandQueue, clReleaseCommandQueue),
    REQ(Flush, clFlush),
    REQ(Finish, clFinish),
    REQ(CreateBuffer, clCreateBuffer),
    OPT(CreateImage, clCreateImage),
    OPT(CreateImage2D, clCreateImage2D),
    REQ(GetSupportedImageFormats, clGetSupportedImageFormats),
    REQ(ReleaseMemObject, clReleaseMemObject),
    REQ(EnqueueWriteBuffer, clEnqueueWriteBuffer),
    REQ(EnqueueReadBuffer, clEnqueueReadBuffer),
    REQ(EnqueueWriteImage, clEnqueueWriteImage),
    REQ(EnqueueReadImage, clEnqueueReadImage),
    REQ(CreateProgramWithSource, clCreateProgramWithSource),
    REQ(CreateProgramWithBinary, clCreateProgramWithBinary),
    REQ(BuildProgram, clBuildProgram),
    REQ(GetProgramInfo, clGetProgramInfo),
    REQ(GetProgramBuildInfo, clGetProgramBuildInfo),
    REQ(ReleaseProgram, clReleaseProgram),
    REQ(CreateKernel, clCreateKernel),
    REQ(SetKernelArg, clSetKernelArg),
    REQ(GetKernelInfo, clGetKernelInfo),
    REQ(GetKernelWorkGroupInfo, clGetKernelWorkGroupInfo),
    REQ(ReleaseKernel, clReleaseKernel),
    REQ(EnqueueNDRangeKernel, clEnqueueNDRangeKernel),
    REQ(WaitForEvents, clWaitForEvents),
    REQ(GetEventProfilingInfo, clGetEventProfilingInfo),
    REQ(ReleaseEvent, clReleaseEvent),
    OPT(EnqueueMapBuffer, clEnqueueMapBuffer),
    OPT(EnqueueUnmapMemObject, clEnqueueUnmapMemObject),
};

/* dlerror() names the file first ("PATH: cannot open shared object file: ..."); the path is listed already. */
static const char *without_path(const char *msg, const char *path) {
    size_t n = strlen(path);
    return strncmp(msg, path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ' ? msg + n + 2 : msg;
}

static int try_load(tcl_api *api, const char *path, char *why, size_t whylen) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    size_t i;
    if (!h) {
        const char *e = dlerror();
        snprintf(why, whylen, "%s", e ? without_path(e, path) : "dlopen failed");
        return 0;
    }
    memset(api, 0, sizeof *api);
    for (i = 0; i < sizeof SYMBOLS / sizeof SYMBOLS[0]; i++) {
        void *f = dlsym(h, SYMBOLS[i].symbol);
        if (!f && SYMBOLS[i].required) {
            snprintf(why, whylen, "loaded, but it has no %s (an ICD driver must be loaded through an ICD loader)",
                     SYMBOLS[i].symbol);
            dlclose(h);
            return 0;
        }
        /* POSIX guarantees a data pointer from dlsym converts to a function pointer of the same size. */
        memcpy((char *)api + SYMBOLS[i].offset, &f, sizeof f);
    }
    if (!api->CreateCommandQueue && !api->CreateCommandQueueWithProperties) {
        snprintf(why, whylen, "loaded, but it has no clCreateCommandQueue");
        dlclose(h);
        return 0;
    }
    if (!api->CreateImage && !api->CreateImage2D) {
        snprintf(why, whylen, "loaded, but it has no clCreateImage");
        dlclose(h);
        return 0;
    }
    api->handle = h;
    snprintf(api->path, sizeof api->path, "%s", path);
    return 1;
}

/* The fix, last in the message (a reader that keeps only the tail of an error still shows it). */
#ifdef __ANDROID__
static const char LOAD_HINT[] =
    "\nset TUNER_OPENCL_LIB to the vendor's OpenCL library (find it with: ls /vendor/lib64 /system/vendor/lib64 "
    "| grep -i -e opencl -e mali)";
#else
static const char LOAD_HINT[] =
    "\nset TUNER_OPENCL_LIB to the OpenCL ICD loader (libOpenCL.so.1) or a vendor's libOpenCL.so; where OpenCL comes "
    "from Python wheels (pyopencl, tuner[cpu]), this sets it and the drivers' list (OCL_ICD_VENDORS):\n"
    "  eval \"$(tuner native env | sed 's/^/export /')\"";
#endif

/* Appends "\n  LABEL: WHY" to list (cap bytes) while it fits with room to spare for "\n  ..." (then written once). */
static void add_tried(char *list, size_t cap, size_t *used, int *cut, const char *label, const char *why) {
    int n;
    if (*cut) return;
    n = snprintf(list + *used, cap - *used, "\n  %s: %s", label, why);
    if (n >= 0 && *used + (size_t)n + 7 <= cap) {
        *used += (size_t)n;
        return;
    }
    snprintf(list + *used, cap - *used, "\n  ...");
    *cut = 1;
}

int tcl_load(tcl_api *api, char *err) {
    static const char head[] = "no OpenCL library could be loaded; tried:";
    char tried[TNR_ERRLEN] = "", why[512], label[600];
    const char *over = getenv("TUNER_OPENCL_LIB");
    /* room for the head and the hint: every path tried is listed, the fix is never cut off */
    size_t cap = TNR_ERRLEN - sizeof head - sizeof LOAD_HINT, used = 0;
    int i, cut = 0;
    if (over && *over) {
        if (try_load(api, over, why, sizeof why)) return TNR_OK;
        snprintf(label, sizeof label, "$TUNER_OPENCL_LIB=%s", over);
        add_tried(tried, cap, &used, &cut, label, why);
    } else {
        add_tried(tried, cap, &used, &cut, "$TUNER_OPENCL_LIB", over ? "set but empty" : "not set");
    }
    for (i = 0; tcl_default_paths[i]; i++) {
        if (try_load(api, tcl_default_paths[i], why, sizeof why)) return TNR_OK;
        add_tried(tried, cap, &used, &cut, tcl_default_paths[i], why);
    }
    memset(api, 0, sizeof *api);
    return tnr_fail(err, TNR_E_OPENCL, "%s%s%s", head, tried, LOAD_HINT);
}

void tcl_unload(tcl_api *api) {
    if (api->handle) dlclose(api->handle);
    memset(api, 0, sizeof *api);
}

const char *tcl_error_name(cl_int code) {
    switch (code) {
#define E(n, v) \
    case v: return #n;
        E(CL_SUCCESS, 0)
        E(CL_DEVICE_NOT_FOUND, -1)
        E(CL_DEVICE_NOT_AVAILABLE, -2)
        E(CL_COMPILER_NOT_AVAILABLE, -3)
        E(CL_MEM_OBJECT_ALLOCATION_FAILURE, -4)
        E(CL_OUT_OF_RESOURCES, -5)
        E(CL_OUT_OF_HOST_MEMORY, -6)
        E(CL_PROFILING_INFO_NOT_AVAILABLE, -7)
        E(CL_MEM_COPY_OVERLAP, -8)
        E(CL_IMAGE_FORMAT_MISMATCH, -9)
        E(CL_IMAGE_FORMAT_NOT_SUPPORTED, -10)
        E(CL_BUILD_PROGRAM_FAILURE, -11)
        E(CL_MAP_FAILURE, -12)
        E(CL_MISALIGNED_SUB_BUFFER_OFFSET, -13)
        E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST, -14)
        E(CL_COMPILE_PROGRAM_FAILURE, -15)
        E(CL_LINKER_NOT_AVAILABLE, -16)
        E(CL_LINK_PROGRAM_FAILURE, -17)
        E(CL_DEVICE_PARTITION_FAILED, -18)
        E(CL_KERNEL_ARG_INFO_NOT_AVAILABLE, -19)
        E(CL_INVALID_VALUE, -30)
        E(CL_INVALID_DEVICE_TYPE, -31)
        E(CL_INVALID_PLATFORM, -32)
        E(CL_INVALID_DEVICE, -33)
        E(CL_INVALID_CONTEXT, -34)
        E(CL_INVALID_QUEUE_PROPERTIES, -35)
        E(CL_INVALID_COMMAND_QUEUE, -36)
        E(CL_INVALID_HOST_PTR, -37)
        E(CL_INVALID_MEM_OBJECT, -38)
        E(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR, -39)
        E(CL_INVALID_IMAGE_SIZE, -40)
        E(CL_INVALID_SAMPLER, -41)
        E(CL_INVALID_BINARY, -42)
        E(CL_INVALID_BUILD_OPTIONS, -43)
        E(CL_INVALID_PROGRAM, -44)
        E(CL_INVALID_PROGRAM_EXECUTABLE, -45)
        E(CL_INVALID_KERNEL_NAME, -46)
        E(CL_INVALID_KERNEL_DEFINITION, -47)
        E(CL_INVALID_KERNEL, -48)
        E(CL_INVALID_ARG_INDEX, -49)
        E(CL_INVALID_ARG_VALUE, -50)
        E(CL_INVALID_ARG_SIZE, -51)
        E(CL_INVALID_KERNEL_ARGS, -52)
        E(CL_INVALID_WORK_DIMENSION, -53)
        E(CL_INVALID_WORK_GROUP_SIZE, -54)
        E(CL_INVALID_WORK_ITEM_SIZE, -55)
        E(CL_INVALID_GLOBAL_OFFSET, -56)
        E(CL_INVALID_EVENT_WAIT_LIST, -57)
        E(CL_INVALID_EVENT, -58)
        E(CL_INVALID_OPERATION, -59)
        E(CL_INVALID_GL_OBJECT, -60)
        E(CL_INVALID_BUFFER_SIZE, -61)
        E(CL_INVALID_MIP_LEVEL, -62)
        E(CL_INVALID_GLOBAL_WORK_SIZE, -63)
        E(CL_INVALID_PROPERTY, -64)
        E(CL_INVALID_IMAGE_DESCRIPTOR, -65)
        E(CL_INVALID_COMPILER_OPTIONS, -66)
        E(CL_INVALID_LINKER_OPTIONS, -67)
        E(CL_INVALID_DEVICE_PARTITION_COUNT, -68)
        E(CL_INVALID_PIPE_SIZE, -69)
        E(CL_INVALID_DEVICE_QUEUE, -70)
        E(CL_PLATFORM_NOT_FOUND_KHR, -1001)
#undef E
    default: return "CL_UNKNOWN_ERROR";
    }
}

#define CLFAIL(call, rc) tnr_fail(err, TNR_E_OPENCL, "%s failed: %s (%d)", call, tcl_error_name(rc), (int)(rc))

/* ---- devices ---- */

static void get_string(const tcl_api *api, cl_device_id d, cl_platform_id p, cl_uint what, char *out, size_t len) {
    size_t got = 0, a, b;
    cl_int rc = d ? api->GetDeviceInfo(d, what, len - 1, out, &got) : api->GetPlatformInfo(p, what, len - 1, out, &got);
    if (rc != CL_SUCCESS) got = 0;
    if (got >= len) got = len - 1;
    out[got] = 0;
    /* strip as Python's str.strip() does for ASCII whitespace (and trailing NULs) */
    b = strlen(out);
    while (b > 0 && isspace((unsigned char)out[b - 1])) out[--b] = 0;
    for (a = 0; out[a] && isspace((unsigned char)out[a]); a++) {
    }
    if (a) memmove(out, out + a, b - a + 1);
}

static uint64_t get_uint(const tcl_api *api, cl_device_id d, cl_uint what, size_t size) {
    uint64_t v = 0;
    if (size == 8) {
        cl_ulong u = 0;
        if (api->GetDeviceInfo(d, what, 8, &u, NULL) == CL_SUCCESS) v = u;
    } else if (size == sizeof(size_t)) {
        size_t u = 0;
        if (api->GetDeviceInfo(d, what, sizeof u, &u, NULL) == CL_SUCCESS) v = u;
    } else {
        cl_uint u = 0;
        if (api->GetDeviceInfo(d, what, 4, &u, NULL) == CL_SUCCESS) v = u;
    }
    return v;
}

static void platform_tag(const char *platform, char *tag, size_t len) {
    char low[256];
    size_t i, n = 0;
    for (i = 0; platform[i] && i < sizeof low - 1; i++) low[i] = (char)tolower((unsigned char)platform[i]);
    low[i] = 0;
    if (strstr(low, "portable computing language")) {
        snprintf(tag, len, "pocl");
        return;
    }
    for (i = 0; low[i] && !(isalnum((unsigned char)low[i]) && (unsigned char)low[i] < 128); i++) {
    }
    while (low[i] && isalnum((unsigned char)low[i]) && (unsigned char)low[i] < 128 && n < len - 1) tag[n++] = low[i++];
    tag[n] = 0;
    if (!n) snprintf(tag, len, "cl");
}

static void fingerprint(tcl_device *d) {
    /* Python: sha1("\0".join(fields[k] for k in sorted(fields))) with keys device, driver_version, platform;
     * then re.sub(r"[^a-z0-9-]+", "-", f"{tag}-{type.lower()}-{digest[:8]}"). */
    char buf[800], hex[41], raw[128], type[16];
    size_t i, n = 0;
    int in_bad = 0;
    tnr_sha1_hex(buf, tnr_join3(buf, sizeof buf, d->name, d->driver_version, d->platform_name), hex);
    for (i = 0; d->type[i] && i < sizeof type - 1; i++) type[i] = (char)tolower((unsigned char)d->type[i]);
    type[i] = 0;
    snprintf(raw, sizeof raw, "%s-%s-%.8s", d->platform_tag, type, hex);
    for (i = 0; raw[i]; i++) {
        char ch = raw[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-';
        if (ok) {
            d->fingerprint[n++] = ch;
            in_bad = 0;
        } else if (!in_bad) {
            d->fingerprint[n++] = '-';
            in_bad = 1;
        }
    }
    d->fingerprint[n] = 0;
}

/* Whether the space-separated list holds word (as Python's `word in text.split()`). */
static int has_word(const char *list, const char *word) {
    size_t n = strlen(word);
    const char *p = list;
    while ((p = strstr(p, word)) != NULL) {
        if ((p == list || isspace((unsigned char)p[-1])) && (p[n] == 0 || isspace((unsigned char)p[n]))) return 1;
        p += n;
    }
    return 0;
}

static void describe(const tcl_api *api, tcl_device *d) {
    cl_device_type t = 0;
    size_t sizes[3] = {0, 0, 0}, got = 0;
    get_string(api, NULL, d->platform, CL_PLATFORM_NAME, d->platform_name, sizeof d->platform_name);
    get_string(api, d->id, NULL, CL_DEVICE_NAME, d->name, sizeof d->name);
    get_string(api, d->id, NULL, CL_DRIVER_VERSION, d->driver_version, sizeof d->driver_version);
    get_string(api, d->id, NULL, CL_DEVICE_VERSION, d->opencl_version, sizeof d->opencl_version);
    api->GetDeviceInfo(d->id, CL_DEVICE_TYPE, sizeof t, &t, NULL);
    snprintf(d->type, sizeof d->type, "%s",
             t & CL_DEVICE_TYPE_GPU ? "GPU" : t & CL_DEVICE_TYPE_CPU ? "CPU"
                                          : t & CL_DEVICE_TYPE_ACCELERATOR ? "ACCELERATOR"
                                          : t & CL_DEVICE_TYPE_CUSTOM ? "CUSTOM" : "OTHER");
    d->image_support = (int)get_uint(api, d->id, CL_DEVICE_IMAGE_SUPPORT, 4);
    if (d->image_support) {
        d->image2d_max_width = get_uint(api, d->id, CL_DEVICE_IMAGE2D_MAX_WIDTH, sizeof(size_t));
        d->image2d_max_height = get_uint(api, d->id, CL_DEVICE_IMAGE2D_MAX_HEIGHT, sizeof(size_t));
    }
    d->max_work_group_size = get_uint(api, d->id, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof(size_t));
    if (api->GetDeviceInfo(d->id, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof sizes, sizes, &got) == CL_SUCCESS) {
        d->max_work_item_sizes[0] = sizes[0];
        d->max_work_item_sizes[1] = sizes[1];
        d->max_work_item_sizes[2] = sizes[2];
    }
    d->local_mem_bytes = get_uint(api, d->id, CL_DEVICE_LOCAL_MEM_SIZE, 8);
    d->global_mem_bytes = get_uint(api, d->id, CL_DEVICE_GLOBAL_MEM_SIZE, 8);
    d->max_mem_alloc_bytes = get_uint(api, d->id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, 8);
    d->compute_units = get_uint(api, d->id, CL_DEVICE_MAX_COMPUTE_UNITS, 4);
    get_string(api, d->id, NULL, CL_DEVICE_EXTENSIONS, d->extensions, sizeof d->extensions);
    d->fp16 = has_word(d->extensions, "cl_khr_fp16");
    platform_tag(d->platform_name, d->platform_tag, sizeof d->platform_tag);
    fingerprint(d);
}

int tcl_list_devices(const tcl_api *api, tcl_device **out, int *n, char *err) {
    cl_uint np = 0, p;
    cl_platform_id *plats;
    tcl_device *devs = NULL;
    int count = 0;
    cl_int rc = api->GetPlatformIDs(0, NULL, &np);
    *out = NULL;
    *n = 0;
    if (rc == -1001 || (rc == CL_SUCCESS && np == 0))
        return tnr_fail(err, TNR_E_DEVICE, "no OpenCL platform found (library %s)", api->path);
    if (rc != CL_SUCCESS) return CLFAIL("clGetPlatformIDs", rc);
    plats = calloc(np, sizeof *plats);
    if (!plats) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
    rc = api->GetPlatformIDs(np, plats, &np);
    if (rc != CL_SUCCESS) {
        free(plats);
        return CLFAIL("clGetPlatformIDs", rc);
    }
    for (p = 0; p < np; p++) {
        cl_uint nd = 0, i;
        cl_device_id *ids;
        tcl_device *grown;
        if (api->GetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0) continue;
        ids = calloc(nd, sizeof *ids);
        grown = realloc(devs, (size_t)(count + (int)nd) * sizeof *devs);
        if (!ids || !grown) {
            free(ids);
            free(grown ? grown : devs);
            free(plats);
            return tnr_fail(err, TNR_E_NOMEM, "out of memory");
        }
        devs = grown;
        if (api->GetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, ids, &nd) != CL_SUCCESS) nd = 0;
        for (i = 0; i < nd; i++) {
            tcl_device *d = &devs[count];
            memset(d, 0, sizeof *d);
            d->index = count;
            d->platform = plats[p];
            d->id = ids[i];
            describe(api, d);
            count++;
        }
        free(ids);
    }
    free(plats);
    if (!count) {
        free(devs);
        return tnr_fail(err, TNR_E_DEVICE, "no OpenCL devices found (library %s)", api->path);
    }
    *out = devs;
    *n = count;
    return TNR_OK;
}

static int icontains(const char *hay, const char *needle) {
    size_t i, j, n = strlen(needle);
    if (!n) return 0;
    for (i = 0; hay[i]; i++) {
        for (j = 0; j < n && hay[i + j] && tolower((unsigned char)hay[i + j]) == tolower((unsigned char)needle[j]); j++) {
        }
        if (j == n) return 1;
    }
    return 0;
}

int tcl_is_simulator(const tcl_device *d) {
    return icontains(d->platform_name, "oclgrind") || icontains(d->name, "oclgrind");
}

static int has_rgba_half(const tcl_api *api, cl_context ctx, cl_mem_flags flags) {
    cl_uint n = 0, i;
    cl_image_format *f;
    int found = 0;
    if (api->GetSupportedImageFormats(ctx, flags, CL_MEM_OBJECT_IMAGE2D, 0, NULL, &n) != CL_SUCCESS || !n) return 0;
    f = calloc(n, sizeof *f);
    if (!f) return 0;
    if (api->GetSupportedImageFormats(ctx, flags, CL_MEM_OBJECT_IMAGE2D, n, f, NULL) == CL_SUCCESS)
        for (i = 0; i < n && !found; i++)
            found = f[i].image_channel_order == CL_RGBA && f[i].image_channel_data_type == CL_HALF_FLOAT;
    free(f);
    return found;
}

int tcl_half_images(const tcl_api *api, const tcl_device *d) {
    cl_context ctx;
    char err[TNR_ERRLEN];
    int ok;
    if (!d->image_support || tcl_context(api, d, &ctx, err) != TNR_OK) return 0;
    ok = has_rgba_half(api, ctx, CL_MEM_READ_ONLY) && has_rgba_half(api, ctx, CL_MEM_WRITE_ONLY);
    api->ReleaseContext(ctx);
    return ok;
}

int tcl_device_matches(const tcl_device *d, const char *text) {
    char hay[1024];
    snprintf(hay, sizeof hay, "%s %s %s %s %s", d->platform_name, d->name, d->type, d->platform_tag, d->fingerprint);
    return icontains(hay, text);
}

/* ---- context, queues ---- */

int tcl_context(const tcl_api *api, const tcl_device *d, cl_context *ctx, char *err) {
    cl_context_properties props[3] = {CL_CONTEXT_PLATFORM, (cl_context_properties)d->platform, 0};
    cl_int rc = CL_SUCCESS;
    *ctx = api->CreateContext(props, 1, &d->id, NULL, NULL, &rc);
    if (!*ctx || rc != CL_SUCCESS) {
        *ctx = NULL;
        return CLFAIL("clCreateContext", rc);
    }
    return TNR_OK;
}

int tcl_queue(const tcl_api *api, cl_context ctx, const tcl_device *d, int profiling, cl_command_queue *q, char *err) {
    cl_int rc = CL_SUCCESS;
    if (api->CreateCommandQueue) {
        *q = api->CreateCommandQueue(ctx, d->id, profiling ? CL_QUEUE_PROFILING_ENABLE : 0, &rc);
    } else {
        cl_queue_properties props[3] = {CL_QUEUE_PROPERTIES, profiling ? CL_QUEUE_PROFILING_ENABLE : 0, 0};
        *q = api->CreateCommandQueueWithProperties(ctx, d->id, props, &rc);
    }
    if (!*q || rc != CL_SUCCESS) {
        *q = NULL;
        return CLFAIL("clCreateCommandQueue", rc);
    }
    return TNR_OK;
}

/* ---- programs ---- */

void tcl_build_log(const tcl_api *api, cl_program prog, const tcl_device *d, char *out, size_t len) {
    size_t got = 0;
    out[0] = 0;
    if (api->GetProgramBuildInfo(prog, d->id, CL_PROGRAM_BUILD_LOG, len - 1, out, &got) != CL_SUCCESS) {
        /* a log longer than the buffer: the driver refuses; take the start of it */
        char *full;
        if (api->GetProgramBuildInfo(prog, d->id, CL_PROGRAM_BUILD_LOG, 0, NULL, &got) != CL_SUCCESS || !got) return;
        full = malloc(got + 1);
        if (!full) return;
        if (api->GetProgramBuildInfo(prog, d->id, CL_PROGRAM_BUILD_LOG, got, full, NULL) == CL_SUCCESS) {
            full[got] = 0;
            snprintf(out, len, "%s", full);
        }
        free(full);
        return;
    }
    if (got >= len) got = len - 1;
    out[got] = 0;
}

int tcl_build_source(const tcl_api *api, cl_context ctx, const tcl_device *d, const char *src, size_t len,
                     const char *options, cl_program *prog, char *err) {
    cl_int rc = CL_SUCCESS;
    char log[1536];
    *prog = api->CreateProgramWithSource(ctx, 1, &src, &len, &rc);
    if (!*prog || rc != CL_SUCCESS) {
        *prog = NULL;
        return CLFAIL("clCreateProgramWithSource", rc);
    }
    rc = api->BuildProgram(*prog, 1, &d->id, options ? options : "", NULL, NULL);
    if (rc != CL_SUCCESS) {
        tcl_build_log(api, *prog, d, log, sizeof log);
        api->ReleaseProgram(*prog);
        *prog = NULL;
        return tnr_fail(err, TNR_E_BUILD, "clBuildProgram failed: %s (%d) on %s; build log:\n%s", tcl_error_name(rc),
                        (int)rc, d->name, log);
    }
    return TNR_OK;
}

int tcl_build_binary(const tcl_api *api, cl_context ctx, const tcl_device *d, const unsigned char *bin, size_t len,
                     const char *options, cl_program *prog, char *err) {
    cl_int rc = CL_SUCCESS, status = CL_SUCCESS;
    *prog = api->CreateProgramWithBinary(ctx, 1, &d->id, &len, &bin, &status, &rc);
    if (!*prog || rc != CL_SUCCESS || status != CL_SUCCESS) {
        if (*prog) api->ReleaseProgram(*prog);
        *prog = NULL;
        return tnr_fail(err, TNR_E_BUILD, "clCreateProgramWithBinary refused the binary: %s (%d)",
                        tcl_error_name(rc != CL_SUCCESS ? rc : status), (int)(rc != CL_SUCCESS ? rc : status));
    }
    rc = api->BuildProgram(*prog, 1, &d->id, options ? options : "", NULL, NULL);
    if (rc != CL_SUCCESS) {
        api->ReleaseProgram(*prog);
        *prog = NULL;
        return tnr_fail(err, TNR_E_BUILD, "clBuildProgram of a binary failed: %s (%d)", tcl_error_name(rc), (int)rc);
    }
    return TNR_OK;
}

int tcl_program_binary(const tcl_api *api, cl_program prog, unsigned char **bin, size_t *len, char *err) {
    cl_uint ndev = 0;
    size_t size = 0;
    unsigned char *buf;
    cl_int rc;
    *bin = NULL;
    *len = 0;
    rc = api->GetProgramInfo(prog, CL_PROGRAM_NUM_DEVICES, sizeof ndev, &ndev, NULL);
    if (rc != CL_SUCCESS) return CLFAIL("clGetProgramInfo(NUM_DEVICES)", rc);
    if (ndev != 1) return tnr_fail(err, TNR_E_OPENCL, "program has %u devices, expected 1", ndev);
    rc = api->GetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL);
    if (rc != CL_SUCCESS) return CLFAIL("clGetProgramInfo(BINARY_SIZES)", rc);
    if (!size) return TNR_OK;
    buf = malloc(size);
    if (!buf) return tnr_fail(err, TNR_E_NOMEM, "out of memory (%zu bytes of program binary)", size);
    rc = api->GetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof buf, &buf, NULL);
    if (rc != CL_SUCCESS) {
        free(buf);
        return CLFAIL("clGetProgramInfo(BINARIES)", rc);
    }
    *bin = buf;
    *len = size;
    return TNR_OK;
}

/* ---- memory ---- */

int tcl_buffer(const tcl_api *api, cl_context ctx, size_t bytes, cl_mem *mem, char *err) {
    cl_int rc = CL_SUCCESS;
    *mem = api->CreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &rc);
    if (!*mem || rc != CL_SUCCESS) {
        *mem = NULL;
        return tnr_fail(err, TNR_E_OPENCL, "clCreateBuffer(%zu bytes) failed: %s (%d)", bytes, tcl_error_name(rc),
                        (int)rc);
    }
    return TNR_OK;
}

int tcl_pinned(const tcl_api *api, cl_context ctx, cl_command_queue q, size_t bytes, cl_mem *mem, void **ptr) {
    cl_int rc = CL_SUCCESS;
    *mem = NULL;
    *ptr = NULL;
    if (!api->EnqueueMapBuffer || !api->EnqueueUnmapMemObject || bytes == 0) return TNR_OK;
    *mem = api->CreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes, NULL, &rc);
    if (!*mem || rc != CL_SUCCESS) {
        *mem = NULL;
        return TNR_OK;
    }
    *ptr = api->EnqueueMapBuffer(q, *mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, bytes, 0, NULL, NULL, &rc);
    if (!*ptr || rc != CL_SUCCESS) {
        api->ReleaseMemObject(*mem);
        *mem = NULL;
        *ptr = NULL;
    }
    return TNR_OK;
}

void tcl_pinned_free(const tcl_api *api, cl_command_queue q, cl_mem mem, void *ptr) {
    if (!mem) return;
    if (ptr) {
        api->EnqueueUnmapMemObject(q, mem, ptr, 0, NULL, NULL);
        api->Finish(q);
    }
    api->ReleaseMemObject(mem);
}

int tcl_image(const tcl_api *api, cl_context ctx, size_t w, size_t h, int half, cl_mem *mem, char *err) {
    cl_image_format fmt = {CL_RGBA, half ? CL_HALF_FLOAT : CL_FLOAT};
    cl_int rc = CL_SUCCESS;
    if (api->CreateImage) {
        cl_image_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.image_type = CL_MEM_OBJECT_IMAGE2D;
        desc.image_width = w;
        desc.image_height = h;
        *mem = api->CreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &rc);
    } else {
        *mem = api->CreateImage2D(ctx, CL_MEM_READ_WRITE, &fmt, w, h, 0, NULL, &rc);
    }
    if (!*mem || rc != CL_SUCCESS) {
        *mem = NULL;
        return tnr_fail(err, TNR_E_OPENCL, "clCreateImage(%zux%zu RGBA %s) failed: %s (%d)", w, h,
                        half ? "half" : "float", tcl_error_name(rc), (int)rc);
    }
    return TNR_OK;
}

int tcl_write_buffer(const tcl_api *api, cl_command_queue q, cl_mem mem, int blocking, size_t offset, size_t bytes,
                     const void *src, char *err) {
    cl_int rc = api->EnqueueWriteBuffer(q, mem, blocking ? CL_TRUE : CL_FALSE, offset, bytes, src, 0, NULL, NULL);
    return rc == CL_SUCCESS ? TNR_OK : CLFAIL("clEnqueueWriteBuffer", rc);
}

int tcl_read_buffer(const tcl_api *api, cl_command_queue q, cl_mem mem, int blocking, size_t offset, size_t bytes,
                    void *dst, char *err) {
    cl_int rc = api->EnqueueReadBuffer(q, mem, blocking ? CL_TRUE : CL_FALSE, offset, bytes, dst, 0, NULL, NULL);
    return rc == CL_SUCCESS ? TNR_OK : CLFAIL("clEnqueueReadBuffer", rc);
}

int tcl_write_image(const tcl_api *api, cl_command_queue q, cl_mem mem, int blocking, size_t w, size_t h,
                    const void *src, char *err) {
    size_t origin[3] = {0, 0, 0}, region[3] = {w, h, 1};
    cl_int rc = api->EnqueueWriteImage(q, mem, blocking ? CL_TRUE : CL_FALSE, origin, region, 0, 0, src, 0, NULL, NULL);
    return rc == CL_SUCCESS ? TNR_OK : CLFAIL("clEnqueueWriteImage", rc);
}

int tcl_read_image(const tcl_api *api, cl_command_queue q, cl_mem mem, int blocking, size_t w, size_t h, void *dst,
                   char *err) {
    size_t origin[3] = {0, 0, 0}, region[3] = {w, h, 1};
    cl_int rc = api->EnqueueReadImage(q, mem, blocking ? CL_TRUE : CL_FALSE, origin, region, 0, 0, dst, 0, NULL, NULL);
    return rc == CL_SUCCESS ? TNR_OK : CLFAIL("clEnqueueReadImage", rc);
}

/* ---- kernels and events ---- */

int tcl_kernel(const tcl_api *api, cl_program prog, const char *name, cl_kernel *k, char *err) {
    cl_int rc = CL_SUCCESS;
    *k = api->CreateKernel(prog, name, &rc);
    if (!*k || rc != CL_SUCCESS) {
        *k = NULL;
        return tnr_fail(err, TNR_E_OPENCL, "clCreateKernel(%s) failed: %s (%d)", name, tcl_error_name(rc), (int)rc);
    }
    return TNR_OK;
}

int tcl_kernel_num_args(const tcl_api *api, cl_kernel k, cl_uint *n, char *err) {
    cl_int rc = api->GetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof *n, n, NULL);
    return rc == CL_SUCCESS ? TNR_OK : CLFAIL("clGetKernelInfo(NUM_ARGS)", rc);
}

int tcl_set_mem_arg(const tcl_api *api, cl_kernel k, cl_uint i, cl_mem mem, char *err) {
    cl_int rc = api->SetKernelArg(k, i, sizeof mem, &mem);
    if (rc != CL_SUCCESS)
        return tnr_fail(err, TNR_E_OPENCL, "clSetKernelArg(%u) failed: %s (%d)", i, tcl_error_name(rc), (int)rc);
    return TNR_OK;
}

int tcl_enqueue(const tcl_api *api, cl_command_queue q, cl_kernel k, const size_t global[3], const size_t local[3],
                cl_event *ev, char *err) {
    cl_int rc = api->EnqueueNDRangeKernel(q, k, 3, NULL, global, local, 0, NULL, ev);
    return rc == CL_SUCCESS ? TNR_OK : CLFAIL("clEnqueueNDRangeKernel", rc);
}

int tcl_finish(const tcl_api *api, cl_command_queue q, char *err) {
    cl_int rc = api->Finish(q);
    return rc == CL_SUCCESS ? TNR_OK : CLFAIL("clFinish", rc);
}

int tcl_event_seconds(const tcl_api *api, cl_event ev, double *seconds, char *err) {
    cl_ulong start = 0, end = 0;
    cl_int rc = api->GetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL);
    if (rc == CL_SUCCESS) rc = api->GetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL);
    if (rc != CL_SUCCESS) return CLFAIL("clGetEventProfilingInfo", rc);
    *seconds = end > start ? (double)(end - start) * 1e-9 : 0.0;
    return TNR_OK;
}
