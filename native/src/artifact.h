/* Reading and checking a compiled-model artifact (docs/artifact.md, format version 4): every one of the 12
 * checks, in the order tuner/artifact/checks.py makes them, each failure a message naming the file (and the
 * field). Nothing here touches OpenCL. */
#ifndef TNR_ARTIFACT_H
#define TNR_ARTIFACT_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"

#define TNR_DIMS 8
enum { TNR_F32 = 0, TNR_F16 = 1, TNR_U8 = 2, TNR_I32 = 3 }; /* int32: a workspace's counters, zero when loaded */
enum { TNR_ARG_ENTRY = 0, TNR_ARG_PARAM = 1, TNR_ARG_WORKSPACE = 2 };

typedef struct {
    const char *name;
    int ndim, nphys;
    int64_t shape[TNR_DIMS], phys[TNR_DIMS];
    int texture, dtype;
    int64_t storage_id;
    int pool;       /* index into pools */
    uint64_t elems; /* product of phys */
} tnr_entry;

typedef struct {
    int64_t id;
    int texture, dtype, nshape;
    int64_t shape[TNR_DIMS];
} tnr_pool;

typedef struct {
    const char *key;
    int texture, dtype, nphys;
    int64_t phys[TNR_DIMS];
    uint64_t elems;
    int64_t offset, nbytes; /* params only */
} tnr_blob;

typedef struct {
    const char *ref; /* "t:NAME" */
    int kind, index; /* TNR_ARG_*, index into entries / params / workspaces */
    const char *pname;
    int image, write;
    const char *type; /* "float", "half" or NULL */
    int64_t extent[3]; /* what the kernel addresses: elements of a buffer; height, width, 4 of an image */
} tnr_arg;

typedef struct {
    const char *kernel;
    int64_t global[3], local[3];
    int nargs;
    tnr_arg *args;
} tnr_call;

typedef struct {
    const char *name, *op, *source, *template_name;
    const char *config_source; /* where a tuned layer's config came from (see tnr_config_source_ok), or NULL */
    double flops;
    int tuned;
    int source_index; /* into sources */
    int ncalls;
    tnr_call *calls;
} tnr_node;

typedef struct {
    char path[32]; /* "kernels/k000.cl" */
    char *text;    /* NUL-terminated */
    size_t len;
    char sha256[65];
} tnr_source;

typedef struct {
    uint64_t image2d_max_width, image2d_max_height, max_work_group_size, max_work_item_sizes[3];
    uint64_t max_mem_alloc_bytes;
} tnr_limits;

typedef struct tnr_artifact {
    char *dir;
    tj_doc *graph_doc;
    int dtype;
    const char *dev_platform, *dev_name, *dev_driver, *dev_fingerprint; /* may be NULL */
    tnr_limits limits; /* the profile graph.json records (absent values: no limit) */
    int nentries, npools, nparams, nworkspaces, ninputs, noutputs, nnodes, nsources;
    tnr_entry *entries;
    tnr_pool *pools;
    tnr_blob *params, *workspaces;
    int *inputs, *outputs; /* entry indices */
    tnr_node *nodes;
    tnr_source *sources;
    unsigned char *params_bin;
    size_t params_size;
    /* lookup tables: indices sorted by name */
    int *entry_sorted, *param_sorted, *ws_sorted;
} tnr_artifact;

/* Reads dir and makes checks 1 to 12 against the profile graph.json records. Every file is read once (relative to
 * the folder, without following a link, non-blocking, checked on its descriptor) and used from those bytes. */
int tnr_artifact_load(const char *dir, tnr_artifact **out, char *err);
/* The same, and the artifact must be signed with key[keylen]: the signature is checked on the very bytes of
 * manifest.json the artifact is then read by (one reading: nothing swapped between the check and the load). */
int tnr_artifact_load_key(const char *dir, const unsigned char *key, size_t keylen, tnr_artifact **out, char *err);
/* Whether sig[slen] (NULL: no signature file) is "hmac-sha256:<hex>" of HMAC-SHA256(key, manifest). */
int tnr_signature_check(const char *dir, const unsigned char *manifest, size_t mlen, const unsigned char *sig,
                        size_t slen, const unsigned char *key, size_t keylen, char *err);
/* Checks dir's signature under key only (reading manifest.json and signature as the load does). */
int tnr_artifact_verify_only(const char *dir, const unsigned char *key, size_t keylen, char *err);
/* Reads a --verify key file: a regular file (non-blocking, checked on its descriptor) of 16 bytes to 1 MiB. */
int tnr_read_key(const char *key_file, unsigned char **key, size_t *len, char *err);
/* Checks 4 and 9 again against another device's limits (the one it is about to run on). */
int tnr_artifact_check_limits(const tnr_artifact *a, const tnr_limits *lim, const char *device_name, char *err);
void tnr_artifact_free(tnr_artifact *a);
size_t tnr_dtype_size(int dtype);
/* Whether s is a config_source the compiler writes: "tuned", "fallback", or "sibling <fingerprint>",
 * "dtype: tuned in <dtype>", "transferred from <workload>", "predicted: config of <workload>"
 * (tuner/compile/compiler.py CONFIG_SOURCES),
 * at most TNR_CONFIG_SOURCE_MAX bytes, no control characters. */
#define TNR_CONFIG_SOURCE_MAX 512
int tnr_config_source_ok(const char *s);

#endif
