/* tuner native runtime: runs a compiled-model artifact (docs/artifact.md, format version 4) with OpenCL,
 * without Python. C99; link with -ltuner_runtime (it needs libc, libm, libdl and pthread only: OpenCL is
 * loaded at run time with dlopen, see TUNER_OPENCL_LIB).
 *
 *   tnr_runtime *rt;
 *   if (tnr_open("model.art", NULL, &rt) != TNR_OK) { puts(tnr_open_error()); ... }
 *   tnr_set_input(rt, 0, x, n);  tnr_run(rt);  tnr_get_output(rt, 0, y, m);
 *   tnr_close(rt);
 *
 * Every function returns TNR_OK (0) or an error code; the message is tnr_last_error(rt). The library never
 * exits or prints. A runtime is not thread-safe: use one per thread, or lock around it. */
#ifndef TUNER_RUNTIME_H
#define TUNER_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TNR_OK = 0,
    TNR_E_ARG = 1,      /* a bad argument (index, size, NULL pointer, unknown device) */
    TNR_E_IO = 2,       /* a file could not be read or written */
    TNR_E_ARTIFACT = 3, /* the artifact fails a check of docs/artifact.md */
    TNR_E_OPENCL = 4,   /* no OpenCL library, or an OpenCL call failed */
    TNR_E_DEVICE = 5,   /* no (matching) OpenCL device */
    TNR_E_BUILD = 6,    /* a kernel source did not build */
    TNR_E_NOMEM = 7,    /* out of host memory */
    TNR_E_STATE = 8     /* a call out of order (e.g. run before every input was set) */
};

#define TNR_MAX_DIMS 8

typedef struct tnr_runtime tnr_runtime;

/* Open an artifact directory on a device. device: NULL or "" for the attached device the artifact was
 * compiled for (same platform, device name and driver), else the default device (a GPU, then PoCL, then
 * another CPU; never a simulator); a decimal index into tnr_list_devices' order; or a case-insensitive
 * substring of a device's platform, name, type, platform tag or fingerprint ("pocl", "intel", "gpu",
 * "pocl-cpu-e66d8a71"). Checks the artifact, allocates, uploads the parameters and builds the kernels
 * (with a binary cache under <dir>/binaries/). On failure *rt is NULL and tnr_open_error() says why. */
int tnr_open(const char *dir, const char *device, tnr_runtime **rt);
/* tnr_open for an artifact that must be signed with key_file (`tuner compile --sign KEYFILE`): the signature is
 * checked on the very bytes of manifest.json the artifact is then read by, every file is read once and used from
 * those bytes, and program binaries come only from this user's own cache ($XDG_CACHE_HOME/tuner/binaries, else
 * ~/.cache/tuner/binaries; none without either), never from <dir>/binaries/, which the signature does not cover:
 * what runs is what was verified. Fails (TNR_E_ARTIFACT) when the artifact is unsigned, signed with another key
 * or changed after signing; TNR_E_IO when the key file is not a regular file of 16 bytes to 1 MiB. */
int tnr_open_verified(const char *dir, const char *device, const char *key_file, tnr_runtime **rt);
/* The message of the last failed tnr_open or tnr_open_verified in this thread. */
const char *tnr_open_error(void);
void tnr_close(tnr_runtime *rt);
const char *tnr_last_error(const tnr_runtime *rt);
/* A short name of an error code ("artifact", "opencl", ...). */
const char *tnr_code_name(int code);

/* Check an artifact (the 11 checks of docs/artifact.md, against its own device profile) without OpenCL.
 * err: a buffer of errlen bytes for the message. */
int tnr_check(const char *dir, char *err, size_t errlen);

/* Check an artifact's signature (`tuner compile --sign KEYFILE`): <dir>/signature must be the line
 * "hmac-sha256:<hex>" of HMAC-SHA256(key file's bytes, manifest.json). TNR_E_ARTIFACT when the artifact is not
 * signed or the signature does not match; TNR_E_IO when the key file cannot be read or holds under 16 bytes. A
 * check only: the files may change after it returns. To run what was verified, open with tnr_open_verified. */
int tnr_verify_signature(const char *dir, const char *key_file, char *err, size_t errlen);

/* Devices, as `tuner devices` lists them (one line each: index, platform, name, type, fingerprint).
 * Writes at most len bytes into out (NUL-terminated). */
int tnr_list_devices(char *out, size_t len, char *err, size_t errlen);

int tnr_num_inputs(const tnr_runtime *rt);
int tnr_num_outputs(const tnr_runtime *rt);
const char *tnr_input_name(const tnr_runtime *rt, int i);
const char *tnr_output_name(const tnr_runtime *rt, int i);
/* The logical (NCHW) shape: writes up to TNR_MAX_DIMS values into dims, returns the rank (-1: bad index). */
int tnr_input_shape(const tnr_runtime *rt, int i, int64_t *dims);
int tnr_output_shape(const tnr_runtime *rt, int i, int64_t *dims);
/* "float32" or "float16": the artifact's storage type (inputs and outputs are float32 either way). */
const char *tnr_dtype(const tnr_runtime *rt);
/* Platform and name of the device it runs on; the binary cache key. */
const char *tnr_device_name(const tnr_runtime *rt);
const char *tnr_device_fingerprint(const tnr_runtime *rt);
/* How the programs were built: from source, from a cached binary. */
void tnr_build_stats(const tnr_runtime *rt, int *from_source, int *from_binary);
/* How many inputs and outputs are staged in pinned host memory (CL_MEM_ALLOC_HOST_PTR, mapped once), so that their
 * copies move at the bus's speed; the others are staged in ordinary memory. TUNER_RUN_PINNED=0 turns pinning off. */
int tnr_pinned_stages(const tnr_runtime *rt);

/* Copy input i (n float32 values, row-major, n = product of its shape); it is written to the device by
 * every tnr_run. */
int tnr_set_input(tnr_runtime *rt, int i, const float *data, size_t n);
/* One run: write every input, enqueue every kernel in order, read every output, all on one in-order queue,
 * then wait once. */
int tnr_run(tnr_runtime *rt);
/* Output i of the last run, as n float32 values. */
int tnr_get_output(tnr_runtime *rt, int i, float *data, size_t n);
/* Wall-clock seconds of `repeats` whole runs (as tnr_run), after `warmup` untimed ones: seconds[repeats]. */
int tnr_time(tnr_runtime *rt, int warmup, int repeats, double *seconds);

/* Nodes, in run order. */
int tnr_num_nodes(const tnr_runtime *rt);
const char *tnr_node_name(const tnr_runtime *rt, int i);
const char *tnr_node_op(const tnr_runtime *rt, int i);
const char *tnr_node_template(const tnr_runtime *rt, int i); /* "" for a glue kernel */
double tnr_node_flops(const tnr_runtime *rt, int i);
/* 1 when the node's config is the log's best for its exact task on this device (config source "tuned"), 0 for
 * any other source or a glue kernel. */
int tnr_node_tuned(const tnr_runtime *rt, int i);
/* Where a tuned layer's config came from, as the artifact records it (`config_source`, checked on load): "tuned",
 * "sibling <fingerprint>" (a named sibling device's record), "dtype: tuned in <dtype>" (the same layer's record
 * in the other storage dtype: float32's for a float16 model), "transferred from <workload>" (a nearby tuned
 * workload's), "predicted: config of <workload>" (the cost model's pick) or "fallback"; "tuned" or "fallback"
 * from the tuned flag where the artifact records none; "" for a glue kernel. */
const char *tnr_node_config_source(const tnr_runtime *rt, int i);
/* "texture", "buffer" or "mixed": the storage of the node's kernel arguments. */
const char *tnr_node_storage(const tnr_runtime *rt, int i);
/* Per-node kernel time from OpenCL profiling events (a queue with profiling, used only here): the median
 * over `repeats` runs of the sum of the node's launches, in seconds: node_seconds[tnr_num_nodes(rt)]. */
int tnr_profile(tnr_runtime *rt, int repeats, double *node_seconds);

#ifdef __cplusplus
}
#endif
#endif
