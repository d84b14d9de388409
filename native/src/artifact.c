#define _POSIX_C_SOURCE 200809L
#include "artifact.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bounds.h"
#include "common.h"
#include "sha256.h"

#define MAX_MANIFEST ((size_t)1 << 20)
#define MAX_GRAPH ((size_t)64 << 20)
#define MAX_KERNEL ((size_t)16 << 20)
#define MAX_PARAMS ((size_t)1 << 40)
#define MAX_DIM 2147483647LL
#define LAUNCH_SLACK 16
#define PARAM_ALIGN 64
#define REDO "recompile the model"

/* A failure in graph.json: "<dir>/graph.json: <what>; recompile the model". */
#define GFAIL(...) graph_fail(a, err, __VA_ARGS__)
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int graph_fail(const tnr_artifact *a, char *err, const char *fmt, ...) {
    char msg[TNR_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tnr_fail(err, TNR_E_ARTIFACT, "%s/graph.json: %s; " REDO, a->dir, msg);
}

size_t tnr_dtype_size(int dtype) { return dtype == TNR_F32 || dtype == TNR_I32 ? 4 : dtype == TNR_F16 ? 2 : 1; }

static int is_texture(const char *scope) { return strncmp(scope, "texture", 7) == 0; }

static int dtype_code(const char *s) {
    return strcmp(s, "float32") == 0 ? TNR_F32 : strcmp(s, "float16") == 0 ? TNR_F16 : strcmp(s, "uint8") == 0 ? TNR_U8
         : strcmp(s, "int32") == 0 ? TNR_I32 : -1;
}

/* ------------------------------------------------------------------------------------------------------------
 * check 1: the manifest */

static int manifest_path_ok(const char *p) {
    size_t n = strlen(p), i, digits;
    if (strcmp(p, "graph.json") == 0 || strcmp(p, "params.bin") == 0) return 1;
    if (n < 8 || strncmp(p, "kernels/k", 9) != 0) return 0;
    if (n < 9 + 3 + 3 || strcmp(p + n - 3, ".cl") != 0) return 0;
    digits = n - 9 - 3;
    if (digits < 3 || digits > 6) return 0;
    for (i = 9; i < n - 3; i++)
        if (p[i] < '0' || p[i] > '9') return 0;
    return 1;
}

static int kernel_file_ok(const char *s) { /* ^k[0-9]{3,6}\.cl$ */
    char buf[40];
    if (strlen(s) > 20) return 0;
    snprintf(buf, sizeof buf, "kernels/%s", s);
    return s[0] == 'k' && manifest_path_ok(buf);
}

/* Reads name under the folder dirfd once: opened with O_NOFOLLOW and O_NONBLOCK, checked on the descriptor (a
 * regular file of `size` bytes when size >= 0, of at most cap bytes) before a byte is read. `shown` is the path as
 * messages show it. The bytes returned (NUL-terminated) are the ones the caller checks and uses. */
static int read_at(int dirfd, const char *name, const char *shown, int64_t size, size_t cap, unsigned char **data,
                   size_t *len, int missing_ok, char *err) {
    struct stat st;
    int rc;
    int fd = openat(dirfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    memset(&st, 0, sizeof st);
    *data = NULL;
    if (len) *len = 0;
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) {
            if (missing_ok) return TNR_OK;
            return tnr_fail(err, TNR_E_ARTIFACT, "%s is missing (listed in manifest.json); " REDO, shown);
        }
        if (errno == ELOOP || errno == EMLINK)
            return tnr_fail(err, TNR_E_ARTIFACT, "%s is a symbolic link; an artifact holds its own files; " REDO, shown);
        return tnr_fail(err, TNR_E_ARTIFACT, "%s cannot be read (%s); " REDO, shown, strerror(errno));
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tnr_fail(err, TNR_E_ARTIFACT, "%s is not a regular file (it is %s); " REDO, shown,
                        tnr_file_kind((unsigned)st.st_mode));
    }
    if (size >= 0 && (int64_t)st.st_size != size) {
        close(fd);
        return tnr_fail(err, TNR_E_ARTIFACT,
                        "%s holds %lld bytes, manifest.json says %lld: the file was truncated or replaced; " REDO, shown,
                        (long long)st.st_size, (long long)size);
    }
    if ((uint64_t)st.st_size > cap) {
        close(fd);
        return tnr_fail(err, TNR_E_ARTIFACT, "%s holds %lld bytes, more than the %zu an artifact's file may; " REDO,
                        shown, (long long)st.st_size, cap);
    }
    switch ((rc = tnr_read_fd(fd, (size_t)st.st_size, data))) {
    case 0: break;
    case -1: return tnr_fail(err, TNR_E_NOMEM, "%s: out of memory (%lld bytes)", shown, (long long)st.st_size);
    default:
        return tnr_fail(err, TNR_E_ARTIFACT, "%s cannot be read (%s); " REDO, shown, rc == -2 ? "it shrank" : strerror(rc));
    }
    if (len) *len = (size_t)st.st_size;
    return TNR_OK;
}

/* Reads a listed file (under the artifact's folder dfd, or kernels/ under kfd, opened without following a link):
 * regular, of the manifest's size, then its SHA-256. */
static int read_listed(const char *dir, int dfd, int *kfd, const char *rel, int64_t size, const char *sha, size_t cap,
                       unsigned char **data, char *err) {
    char path[4096], hex[65];
    const char *name = rel;
    int rc, at = dfd;
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    *data = NULL;
    if (strncmp(rel, "kernels/", 8) == 0) {
        if (*kfd < 0) {
            char sub[4096];
            struct stat lst;
            snprintf(sub, sizeof sub, "%s/kernels", dir);
            *kfd = openat(dfd, "kernels", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (*kfd < 0) {
                if (errno == ENOENT)
                    return tnr_fail(err, TNR_E_ARTIFACT, "%s is missing (listed in manifest.json); " REDO, path);
                if (fstatat(dfd, "kernels", &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode))
                    return tnr_fail(err, TNR_E_ARTIFACT, "%s is a symbolic link (or lies under one); an artifact holds "
                                    "its own files; " REDO, path);
                return tnr_fail(err, TNR_E_ARTIFACT, "%s is not a folder; " REDO, sub);
            }
        }
        at = *kfd;
        name = rel + 8;
    }
    rc = read_at(at, name, path, size, cap, data, NULL, 0, err);
    if (rc) return rc;
    tnr_sha256_hex(*data, (size_t)size, hex);
    if (strcmp(hex, sha) != 0) {
        free(*data);
        *data = NULL;
        return tnr_fail(err, TNR_E_ARTIFACT,
                        "%s does not match its SHA-256 in manifest.json: the file was edited or replaced; " REDO, path);
    }
    return TNR_OK;
}

int tnr_signature_check(const char *dir, const unsigned char *manifest, size_t mlen, const unsigned char *sig,
                        size_t slen, const unsigned char *key, size_t keylen, char *err) {
    char want[12 + 2 * 32 + 1];
    unsigned char mac[32];
    unsigned diff = 0;
    size_t i;
    if (!sig)
        return tnr_fail(err, TNR_E_ARTIFACT, "%s is not signed (no signature file): sign it with `tuner compile --sign "
                        "KEY`, or run it without --verify", dir);
    tnr_hmac_sha256(key, keylen, manifest, mlen, mac);
    memcpy(want, "hmac-sha256:", 12);
    for (i = 0; i < 32; i++) snprintf(want + 12 + 2 * i, 3, "%02x", mac[i]);
    while (slen && (sig[slen - 1] == '\n' || sig[slen - 1] == '\r' || sig[slen - 1] == ' ')) slen--;
    if (slen != 12 + 64) diff = 1;
    for (i = 0; i < 12 + 64; i++) diff |= (unsigned)((i < slen ? sig[i] : 0) ^ (unsigned char)want[i]);
    if (diff)
        return tnr_fail(err, TNR_E_ARTIFACT, "%s: the signature does not match manifest.json under this key: the artifact "
                        "was changed after it was signed, or signed with another key", dir);
    return TNR_OK;
}

typedef struct {
    const char *path;
    int64_t size;
    const char *sha;
    unsigned char *data;
} listed;

static int verify_manifest(tnr_artifact *a, int dfd, const unsigned char *key, size_t keylen, listed **out, int *nout,
                           unsigned char **graph, size_t *graph_len, char *err) {
    unsigned char *text = NULL;
    size_t len = 0, i, j;
    char jerr[256], path[4096];
    tj_doc *doc;
    tj_value *m, *files, *fmt, *ver;
    listed *l;
    int rc, found_graph = 0, found_params = 0, kfd = -1;
    *out = NULL;
    *nout = 0;
    snprintf(path, sizeof path, "%s/manifest.json", a->dir);
    rc = read_at(dfd, "manifest.json", path, -1, MAX_MANIFEST, &text, &len, 1, err);
    if (rc) return rc;
    if (!text)
        return tnr_fail(err, TNR_E_ARTIFACT, "%s is missing: %s is not a version 4 artifact (compile the model "
                        "with `tuner compile MODEL -o %s`)", path, a->dir, a->dir);
    if (key) { /* the signature checked on the very bytes read below: one reading of the manifest */
        unsigned char *sig = NULL;
        size_t slen = 0;
        char spath[4200];
        snprintf(spath, sizeof spath, "%s/signature", a->dir);
        rc = read_at(dfd, "signature", spath, -1, 4096, &sig, &slen, 1, err);
        if (!rc) rc = tnr_signature_check(a->dir, text, len, sig, slen, key, keylen, err);
        free(sig);
        if (rc) {
            free(text);
            return rc;
        }
    }
    doc = tnr_json_parse((const char *)text, len, MAX_MANIFEST, jerr, sizeof jerr);
    free(text);
    if (!doc) return tnr_fail(err, TNR_E_ARTIFACT, "%s is not valid JSON (%s); " REDO, path, jerr);
    m = tnr_json_root(doc);
    fmt = tnr_json_get(m, "format");
    ver = tnr_json_get(m, "version");
    files = tnr_json_get(m, "files");
    if (!fmt || fmt->type != TJ_STRING || strcmp(fmt->s, "tuner-artifact") != 0 || !ver || ver->type != TJ_NUMBER ||
        !ver->is_int || ver->i != 4 || !files || files->type != TJ_ARRAY) {
        char v[32] = "none";
        if (ver && ver->type == TJ_NUMBER) snprintf(v, sizeof v, "%g", ver->d);
        tnr_json_free(doc);
        return tnr_fail(err, TNR_E_ARTIFACT, "%s: not a 'tuner-artifact' version 4 manifest (version %s); " REDO, path, v);
    }
    l = calloc(files->len ? files->len : 1, sizeof *l);
    if (!l) {
        tnr_json_free(doc);
        return tnr_fail(err, TNR_E_NOMEM, "out of memory");
    }
    for (i = 0; i < files->len; i++) {
        tj_value *f = files->items[i], *p = tnr_json_get(f, "path"), *s = tnr_json_get(f, "size"),
                 *h = tnr_json_get(f, "sha256");
        int ok = p && p->type == TJ_STRING && strlen(p->s) == p->len && manifest_path_ok(p->s) && s &&
                 s->type == TJ_NUMBER && s->is_int && s->i >= 0 && h && h->type == TJ_STRING;
        for (j = 0; ok && j < i; j++)
            if (strcmp(l[j].path, p->s) == 0) ok = 0;
        if (!ok) {
            rc = tnr_fail(err, TNR_E_ARTIFACT, "%s: files[%zu] is not a path, size and sha256, or repeats; " REDO, path, i);
            goto fail;
        }
        l[i].path = p->s;
        l[i].size = s->i;
        l[i].sha = h->s;
    }
    for (i = 0; i < files->len; i++) {
        size_t cap = strcmp(l[i].path, "graph.json") == 0 ? MAX_GRAPH : strcmp(l[i].path, "params.bin") == 0 ? MAX_PARAMS : MAX_KERNEL;
        rc = read_listed(a->dir, dfd, &kfd, l[i].path, l[i].size, l[i].sha, cap, &l[i].data, err);
        if (rc) goto fail;
        if (strcmp(l[i].path, "graph.json") == 0) found_graph = 1;
        if (strcmp(l[i].path, "params.bin") == 0) found_params = 1;
    }
    if (!found_graph || !found_params) {
        rc = tnr_fail(err, TNR_E_ARTIFACT, "%s does not list %s; " REDO, path, found_graph ? "params.bin" : "graph.json");
        goto fail;
    }
    /* the paths point into the manifest's DOM: copy what outlives it */
    for (i = 0; i < files->len; i++) {
        if (strcmp(l[i].path, "graph.json") == 0) {
            *graph = l[i].data;
            *graph_len = (size_t)l[i].size;
            l[i].data = NULL;
        } else if (strcmp(l[i].path, "params.bin") == 0) {
            a->params_bin = l[i].data;
            a->params_size = (size_t)l[i].size;
            l[i].data = NULL;
        } else {
            tnr_source *grown = realloc(a->sources, (size_t)(a->nsources + 1) * sizeof *grown);
            if (!grown) {
                rc = tnr_fail(err, TNR_E_NOMEM, "out of memory");
                goto fail;
            }
            a->sources = grown;
            memset(&grown[a->nsources], 0, sizeof *grown);
            snprintf(grown[a->nsources].path, sizeof grown[a->nsources].path, "%s", l[i].path);
            snprintf(grown[a->nsources].sha256, sizeof grown[a->nsources].sha256, "%s", l[i].sha);
            grown[a->nsources].text = (char *)l[i].data;
            grown[a->nsources].len = (size_t)l[i].size;
            l[i].data = NULL;
            a->nsources++;
        }
    }
    free(l);
    tnr_json_free(doc);
    if (kfd >= 0) close(kfd);
    return TNR_OK;
fail:
    for (j = 0; j < files->len; j++) free(l[j].data);
    free(l);
    tnr_json_free(doc);
    if (kfd >= 0) close(kfd);
    return rc;
}

int tnr_read_key(const char *key_file, unsigned char **key, size_t *len, char *err) {
    char e[TNR_ERRLEN];
    int rc = tnr_read_file(key_file, (size_t)1 << 20, key, len, e);
    if (rc == TNR_E_NOMEM) return tnr_fail(err, rc, "--verify %s: out of memory", key_file);
    if (rc) {
        size_t kl = strlen(key_file);
        const char *why = strncmp(e, key_file, kl) == 0 && e[kl] == ':' ? e + kl + 2 : e;
        return tnr_fail(err, TNR_E_IO, "--verify %s: cannot read the key file (%s); give a file of random bytes (head -c "
                        "32 /dev/urandom > KEY makes one)", key_file, why);
    }
    if (*len < 16) {
        memset(*key, 0, *len);
        free(*key);
        *key = NULL;
        return tnr_fail(err, TNR_E_IO, "--verify %s: the key holds under 16 bytes (%zu); use at least 16 random bytes "
                        "(head -c 32 /dev/urandom > KEY makes one)", key_file, *len);
    }
    return TNR_OK;
}

int tnr_artifact_verify_only(const char *dir, const unsigned char *key, size_t keylen, char *err) {
    unsigned char *manifest = NULL, *sig = NULL;
    size_t mlen = 0, slen = 0;
    char path[4200];
    int rc, dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return tnr_fail(err, TNR_E_ARTIFACT, "%s: no manifest.json to verify (%s)", dir, strerror(errno));
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    rc = read_at(dfd, "manifest.json", path, -1, MAX_MANIFEST, &manifest, &mlen, 1, err);
    if (!rc && !manifest) rc = tnr_fail(err, TNR_E_ARTIFACT, "%s: no manifest.json to verify", dir);
    snprintf(path, sizeof path, "%s/signature", dir);
    if (!rc) rc = read_at(dfd, "signature", path, -1, 4096, &sig, &slen, 1, err);
    if (!rc) rc = tnr_signature_check(dir, manifest, mlen, sig, slen, key, keylen, err);
    free(manifest);
    free(sig);
    close(dfd);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * check 2: graph.json's fields and types */

typedef struct {
    tnr_artifact *a;
    char *err;
} rd;

int tnr_config_source_ok(const char *s) {
    static const char *const exact[] = {"tuned", "fallback"};
    static const char *const prefix[] = {"sibling ", "dtype: ", "transferred from ", "predicted: config of "};
    const unsigned char *c;
    size_t n, k;
    if (!s) return 0;
    n = strlen(s);
    if (n > TNR_CONFIG_SOURCE_MAX) return 0;
    /* shown on a terminal: no control characters (C0, DEL, and C1 as UTF-8 encodes them) */
    for (c = (const unsigned char *)s; *c; c++)
        if (*c < 0x20 || *c == 0x7f || (*c == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f)) return 0;
    for (k = 0; k < sizeof exact / sizeof exact[0]; k++)
        if (!strcmp(s, exact[k])) return 1;
    for (k = 0; k < sizeof prefix / sizeof prefix[0]; k++) {
        size_t m = strlen(prefix[k]);
        if (n > m && !strncmp(s, prefix[k], m)) return 1;
    }
    return 0;
}

static const char *shown(const tj_value *v, char *buf, size_t n) {
    if (!v) return "nothing";
    switch (v->type) {
    case TJ_STRING: {
        /* 50 bytes at most, control characters as \xNN (C1 ones as UTF-8 encodes them): a message goes to a terminal */
        char text[256];
        snprintf(buf, n, "'%s'", tnr_printable(v->s, v->len, 50, text, sizeof text));
        break;
    }
    case TJ_NUMBER:
        if (v->is_int) snprintf(buf, n, "%lld", (long long)v->i);
        else snprintf(buf, n, "%g", v->d);
        break;
    case TJ_BOOL: snprintf(buf, n, "%s", v->d ? "true" : "false"); break;
    default: snprintf(buf, n, "%s", tnr_json_type_name(v->type));
    }
    return buf;
}

static int want(rd *r, const tj_value *v, tj_type t, const char *path, const char *what) {
    char b[96];
    if (v && v->type == t && (t != TJ_NUMBER || v->is_int)) return 0;
    return graph_fail(r->a, r->err, "%s must be %s, got %s", path, what, shown(v, b, sizeof b));
}

static tj_value *get(rd *r, const tj_value *obj, const char *key, const char *path, int *rc) {
    tj_value *v = tnr_json_get(obj, key);
    if (!v) *rc = graph_fail(r->a, r->err, "%s%s%s is missing", path, *path ? "." : "", key);
    return v;
}

static int get_str(rd *r, const tj_value *obj, const char *key, const char *path, const char **out) {
    char p[512];
    int rc = 0;
    tj_value *v = get(r, obj, key, path, &rc);
    if (rc) return rc;
    snprintf(p, sizeof p, "%s%s%s", path, *path ? "." : "", key);
    if ((rc = want(r, v, TJ_STRING, p, "a string"))) return rc;
    if (strlen(v->s) != v->len) return graph_fail(r->a, r->err, "%s holds a NUL character", p);
    *out = v->s;
    return 0;
}

static int get_opt_str(rd *r, const tj_value *obj, const char *key, const char *path, const char **out) {
    tj_value *v = tnr_json_get(obj, key);
    char p[512];
    *out = NULL;
    if (!v || v->type == TJ_NULL) return 0;
    snprintf(p, sizeof p, "%s.%s", path, key);
    if (want(r, v, TJ_STRING, p, "a string")) return TNR_E_ARTIFACT;
    *out = v->s;
    return 0;
}

static int get_int(rd *r, const tj_value *obj, const char *key, const char *path, int64_t *out) {
    char p[512];
    int rc = 0;
    tj_value *v = get(r, obj, key, path, &rc);
    if (rc) return rc;
    snprintf(p, sizeof p, "%s%s%s", path, *path ? "." : "", key);
    if ((rc = want(r, v, TJ_NUMBER, p, "an integer"))) return rc;
    *out = v->i;
    return 0;
}

/* A list of integers (any length up to TNR_DIMS, and more is an error of check 4's kind). */
static int get_ints(rd *r, const tj_value *obj, const char *key, const char *path, int64_t *out, int *n) {
    char p[512];
    int rc = 0;
    size_t i;
    tj_value *v = get(r, obj, key, path, &rc);
    if (rc) return rc;
    snprintf(p, sizeof p, "%s%s%s", path, *path ? "." : "", key);
    if ((rc = want(r, v, TJ_ARRAY, p, "a list"))) return rc;
    for (i = 0; i < v->len; i++) {
        char q[540];
        snprintf(q, sizeof q, "%s[%zu]", p, i);
        if ((rc = want(r, v->items[i], TJ_NUMBER, q, "an integer"))) return rc;
    }
    if (v->len > TNR_DIMS) return graph_fail(r->a, r->err, "%s has %zu values, more than %d", p, v->len, TNR_DIMS);
    for (i = 0; i < v->len; i++) out[i] = v->items[i]->i;
    *n = (int)v->len;
    return 0;
}

static int get_opt_obj(rd *r, const tj_value *obj, const char *key, const char *path) {
    tj_value *v = tnr_json_get(obj, key);
    char p[512];
    if (!v || v->type == TJ_NULL) return 0;
    snprintf(p, sizeof p, "%s.%s", path, key);
    return want(r, v, TJ_OBJECT, p, "an object");
}

static uint64_t limit_of(const tj_value *profile, const char *key, uint64_t dflt) {
    tj_value *v = tnr_json_get(profile, key);
    return v && v->type == TJ_NUMBER && v->is_int && v->i > 0 ? (uint64_t)v->i : dflt;
}

static int read_entry(rd *r, const char *key, const tj_value *e, tnr_entry *out) {
    char p[256];
    const char *scope, *dtype, *layout;
    int rc;
    snprintf(p, sizeof p, "entries['%.80s']", key);
    if ((rc = want(r, e, TJ_OBJECT, p, "an object"))) return rc;
    if ((rc = get_str(r, e, "name", p, &out->name)) || (rc = get_ints(r, e, "shape", p, out->shape, &out->ndim)) ||
        (rc = get_ints(r, e, "physical_shape", p, out->phys, &out->nphys)) ||
        (rc = get_str(r, e, "storage_scope", p, &scope)) || (rc = get_str(r, e, "dtype", p, &dtype)) ||
        (rc = get_opt_str(r, e, "layout", p, &layout)) || (rc = get_int(r, e, "storage_id", p, &out->storage_id)))
        return rc;
    out->texture = is_texture(scope);
    out->dtype = dtype_code(dtype);
    /* the scope and dtype strings are checked (check 3) after check 2, as the Python reader does */
    out->pool = strcmp(scope, "global") == 0 || out->texture ? 0 : -2; /* -2: bad scope */
    if (out->dtype == TNR_U8 || out->dtype == TNR_I32) out->dtype = -1;
    return 0;
}

static int read_blob(rd *r, const tj_value *b, const char *p, int stored, tnr_blob *out, int *scope_ok) {
    const char *scope, *dtype;
    int rc;
    if ((rc = want(r, b, TJ_OBJECT, p, "an object"))) return rc;
    if ((rc = get_str(r, b, "key", p, &out->key)) || (rc = get_str(r, b, "scope", p, &scope)) ||
        (rc = get_ints(r, b, "physical_shape", p, out->phys, &out->nphys)) || (rc = get_str(r, b, "dtype", p, &dtype)))
        return rc;
    if (stored && ((rc = get_int(r, b, "offset", p, &out->offset)) || (rc = get_int(r, b, "nbytes", p, &out->nbytes))))
        return rc;
    out->texture = is_texture(scope);
    *scope_ok = strcmp(scope, "global") == 0 || out->texture;
    out->dtype = dtype_code(dtype);
    if (out->dtype == TNR_U8) out->dtype = -1;
    return 0;
}

/* Scope strings kept for check 3's messages. */
typedef struct {
    const char **entry_scope, **pool_scope, **param_scope, **ws_scope;
    const char **entry_dtype, **pool_dtype, **param_dtype, **ws_dtype;
    const char *dtype;
} raw_strings;

/* Name lookups: indices sorted by name (a merge sort: qsort takes no context in C11), then binary search. */
typedef const char *(*name_of)(const tnr_artifact *, int);
static const char *entry_name(const tnr_artifact *a, int i) { return a->entries[i].name; }
static const char *param_key(const tnr_artifact *a, int i) { return a->params[i].key; }
static const char *ws_key(const tnr_artifact *a, int i) { return a->workspaces[i].key; }

static void merge_sort(int *v, int *tmp, int n, const tnr_artifact *a, name_of f) {
    int mid = n / 2, i = 0, j, k = 0;
    if (n < 2) return;
    merge_sort(v, tmp, mid, a, f);
    merge_sort(v + mid, tmp, n - mid, a, f);
    j = mid;
    while (i < mid && j < n) tmp[k++] = strcmp(f(a, v[i]), f(a, v[j])) <= 0 ? v[i++] : v[j++];
    while (i < mid) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, (size_t)n * sizeof *v);
}

static int *sorted_index(const tnr_artifact *a, int n, name_of f) {
    int *v = malloc((size_t)(n ? n : 1) * sizeof *v), *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp), i;
    if (!v || !tmp) {
        free(v);
        free(tmp);
        return NULL;
    }
    for (i = 0; i < n; i++) v[i] = i;
    merge_sort(v, tmp, n, a, f);
    free(tmp);
    return v;
}

static int lookup(const tnr_artifact *a, const int *sorted, int n, name_of f, const char *name) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f(a, sorted[mid]), name);
        if (!c) return sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static int read_graph(tnr_artifact *a, tj_value *g, raw_strings *raw, char *err) {
    rd r = {a, err};
    tj_value *fmt, *ver, *dev, *v, *profile;
    int rc = 0;
    size_t i, j, k;
    char p[256];
    if (g->type != TJ_OBJECT) return graph_fail(a, err, "the document must be an object, got %s", tnr_json_type_name(g->type));
    fmt = tnr_json_get(g, "format");
    ver = tnr_json_get(g, "version");
    if (!fmt || fmt->type != TJ_STRING || strcmp(fmt->s, "tuner-artifact") != 0 || !ver || ver->type != TJ_NUMBER ||
        !ver->is_int || ver->i != 4) {
        char b1[96], b2[96];
        return graph_fail(a, err, "artifact format %s version %s; this runtime reads 'tuner-artifact' version 4",
                          shown(fmt, b1, sizeof b1), shown(ver, b2, sizeof b2));
    }
    dev = get(&r, g, "device", "", &rc);
    if (rc || (rc = want(&r, dev, TJ_OBJECT, "device", "an object"))) return rc;
    a->dev_platform = (v = tnr_json_get(dev, "platform")) && v->type == TJ_STRING ? v->s : NULL;
    a->dev_name = (v = tnr_json_get(dev, "device")) && v->type == TJ_STRING ? v->s : NULL;
    a->dev_driver = (v = tnr_json_get(dev, "driver_version")) && v->type == TJ_STRING ? v->s : NULL;
    a->dev_fingerprint = (v = tnr_json_get(dev, "fingerprint")) && v->type == TJ_STRING ? v->s : NULL;
    profile = tnr_json_get(dev, "profile");
    if (profile && profile->type != TJ_OBJECT) profile = NULL;
    a->limits.image2d_max_width = limit_of(profile, "image2d_max_width", MAX_DIM);
    a->limits.image2d_max_height = limit_of(profile, "image2d_max_height", MAX_DIM);
    a->limits.max_work_group_size = limit_of(profile, "max_work_group_size", MAX_DIM);
    a->limits.max_mem_alloc_bytes = limit_of(profile, "max_mem_alloc_bytes", (uint64_t)1 << 63);
    v = tnr_json_get(profile, "max_work_item_sizes");
    for (i = 0; i < 3; i++) {
        tj_value *x = v && v->type == TJ_ARRAY && i < v->len ? v->items[i] : NULL;
        a->limits.max_work_item_sizes[i] = x && x->type == TJ_NUMBER && x->is_int && x->i > 0 ? (uint64_t)x->i : MAX_DIM;
    }
    if ((rc = get_str(&r, g, "dtype", "", &raw->dtype))) return rc;
    a->dtype = dtype_code(raw->dtype);
    /* inputs, outputs: names resolved after the entries */
    for (k = 0; k < 2; k++) {
        const char *key = k ? "outputs" : "inputs";
        v = get(&r, g, key, "", &rc);
        if (rc || (rc = want(&r, v, TJ_ARRAY, key, "a list"))) return rc;
        for (i = 0; i < v->len; i++) {
            snprintf(p, sizeof p, "%s[%zu]", key, i);
            if ((rc = want(&r, v->items[i], TJ_STRING, p, "a string"))) return rc;
        }
    }
    /* nodes */
    v = get(&r, g, "nodes", "", &rc);
    if (rc || (rc = want(&r, v, TJ_ARRAY, "nodes", "a list"))) return rc;
    a->nnodes = (int)v->len;
    a->nodes = calloc(v->len ? v->len : 1, sizeof *a->nodes);
    if (!a->nodes) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
    for (i = 0; i < v->len; i++) {
        tj_value *n = v->items[i], *calls, *x;
        tnr_node *node = &a->nodes[i];
        snprintf(p, sizeof p, "nodes[%zu]", i);
        if ((rc = want(&r, n, TJ_OBJECT, p, "an object"))) return rc;
        calls = get(&r, n, "calls", p, &rc);
        if (rc) return rc;
        {
            char q[300];
            snprintf(q, sizeof q, "%s.calls", p);
            if ((rc = want(&r, calls, TJ_ARRAY, q, "a list"))) return rc;
        }
        node->ncalls = (int)calls->len;
        node->calls = calloc(calls->len ? calls->len : 1, sizeof *node->calls);
        if (!node->calls) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
        for (j = 0; j < calls->len; j++) {
            tj_value *c = calls->items[j], *sig, *args;
            tnr_call *call = &node->calls[j];
            char cp[300];
            int ng = 0, nl = 0;
            int64_t gs[TNR_DIMS], ls[TNR_DIMS];
            snprintf(cp, sizeof cp, "%s.calls[%zu]", p, j);
            if ((rc = want(&r, c, TJ_OBJECT, cp, "an object"))) return rc;
            sig = get(&r, c, "signature", cp, &rc);
            if (rc) return rc;
            {
                char q[340];
                snprintf(q, sizeof q, "%s.signature", cp);
                if ((rc = want(&r, sig, TJ_ARRAY, q, "a list"))) return rc;
            }
            for (k = 0; k < sig->len; k++) {
                tj_value *s = sig->items[k];
                const char *kind, *access, *name, *type;
                char sp[360], b[96];
                snprintf(sp, sizeof sp, "%s.signature[%zu]", cp, k);
                if ((rc = want(&r, s, TJ_OBJECT, sp, "an object")) || (rc = get_str(&r, s, "kind", sp, &kind)) ||
                    (rc = get_str(&r, s, "access", sp, &access)))
                    return rc;
                if (strcmp(kind, "buffer") && strcmp(kind, "image"))
                    return graph_fail(a, err, "%s.kind must be 'buffer' or 'image', got %s", sp,
                                      shown(tnr_json_get(s, "kind"), b, sizeof b));
                if (strcmp(access, "read") && strcmp(access, "write"))
                    return graph_fail(a, err, "%s.access must be 'read' or 'write', got %s", sp,
                                      shown(tnr_json_get(s, "access"), b, sizeof b));
                if ((rc = get_str(&r, s, "name", sp, &name)) || (rc = get_opt_str(&r, s, "type", sp, &type))) return rc;
                {
                    int64_t ext[TNR_DIMS];
                    int ne = 0, m, small = 0;
                    if ((rc = get_ints(&r, s, "extent", sp, ext, &ne))) return rc;
                    for (m = 0; m < ne; m++) small |= ext[m] < 1;
                    if (ne != (strcmp(kind, "buffer") ? 3 : 1) || small)
                        return graph_fail(a, err, "%s.extent must be [elements] for a buffer, [height, width, 4] for "
                                          "an image", sp);
                }
            }
            if ((rc = get_str(&r, c, "kernel", cp, &call->kernel)) || (rc = get_ints(&r, c, "global_size", cp, gs, &ng)) ||
                (rc = get_ints(&r, c, "local_size", cp, ls, &nl)))
                return rc;
            args = get(&r, c, "args", cp, &rc);
            if (rc) return rc;
            {
                char q[340];
                snprintf(q, sizeof q, "%s.args", cp);
                if ((rc = want(&r, args, TJ_ARRAY, q, "a list"))) return rc;
                for (k = 0; k < args->len; k++) {
                    char q2[360];
                    snprintf(q2, sizeof q2, "%s[%zu]", q, k);
                    if ((rc = want(&r, args->items[k], TJ_STRING, q2, "a string"))) return rc;
                }
            }
            /* launch sizes: three each (check 9 reports other lengths) */
            for (k = 0; k < 3; k++) {
                call->global[k] = (int)k < ng ? gs[k] : 0;
                call->local[k] = (int)k < nl ? ls[k] : 0;
            }
            if (ng != 3 || nl != 3) call->global[0] = -1; /* marks a launch of the wrong rank for check 9 */
            call->nargs = (int)(args->len < sig->len ? args->len : sig->len);
            if (args->len != sig->len) call->nargs = -(int)args->len - 1; /* check 8 reports it */
            call->args = calloc(args->len ? args->len : 1, sizeof *call->args);
            if (!call->args) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
            for (k = 0; k < args->len; k++) {
                call->args[k].ref = args->items[k]->s;
                call->args[k].kind = -1;
                call->args[k].index = -1;
                if (k < sig->len) {
                    tj_value *s = sig->items[k];
                    call->args[k].pname = tnr_json_get(s, "name")->s;
                    call->args[k].image = strcmp(tnr_json_get(s, "kind")->s, "image") == 0;
                    call->args[k].write = strcmp(tnr_json_get(s, "access")->s, "write") == 0;
                    x = tnr_json_get(s, "type");
                    call->args[k].type = x && x->type == TJ_STRING ? x->s : NULL;
                    x = tnr_json_get(s, "extent");
                    {
                        size_t m;
                        for (m = 0; m < 3; m++) call->args[k].extent[m] = m < x->len ? (int64_t)x->items[m]->i : 0;
                    }
                }
            }
            if (args->len != sig->len) {
                /* remember both lengths: nargs = -(args)-1, the signature's length in index of args[0] */
                call->args[0].index = (int)sig->len;
            }
        }
        x = tnr_json_get(n, "flops");
        if (x) {
            char q[300];
            snprintf(q, sizeof q, "%s.flops", p);
            if ((rc = want(&r, x, TJ_NUMBER, q, "an integer"))) return rc;
            node->flops = (double)x->i;
        }
        x = tnr_json_get(n, "tuned");
        if (x && x->type != TJ_BOOL) {
            char b[96];
            return graph_fail(a, err, "%s.tuned must be true or false, got %s", p, shown(x, b, sizeof b));
        }
        node->tuned = x && x->d != 0;
        if ((rc = get_str(&r, n, "name", p, &node->name)) || (rc = get_str(&r, n, "op", p, &node->op)) ||
            (rc = get_str(&r, n, "source", p, &node->source)) ||
            (rc = get_opt_str(&r, n, "template", p, &node->template_name)) || (rc = get_opt_obj(&r, n, "workload", p)) ||
            (rc = get_opt_obj(&r, n, "scopes", p)) || (rc = get_opt_obj(&r, n, "config", p)) ||
            (rc = get_opt_str(&r, n, "config_source", p, &node->config_source)))
            return rc;
        if (node->config_source && !tnr_config_source_ok(node->config_source)) {
            char b[96];
            return graph_fail(a, err, "%s.config_source must be tuned, fallback, 'sibling <fingerprint>', 'dtype: "
                              "tuned in <dtype>', 'transferred from <workload>' or 'predicted: config of <workload>' "
                              "(printable, at most "
                              "%d bytes), got %s", p, TNR_CONFIG_SOURCE_MAX,
                              shown(tnr_json_get(n, "config_source"), b, sizeof b));
        }
    }
    /* entries */
    v = get(&r, g, "entries", "", &rc);
    if (rc || (rc = want(&r, v, TJ_OBJECT, "entries", "an object"))) return rc;
    a->nentries = (int)v->len;
    a->entries = calloc(v->len ? v->len : 1, sizeof *a->entries);
    raw->entry_scope = calloc(v->len ? v->len : 1, sizeof(char *));
    raw->entry_dtype = calloc(v->len ? v->len : 1, sizeof(char *));
    if (!a->entries || !raw->entry_scope || !raw->entry_dtype) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
    for (i = 0; i < v->len; i++) {
        if ((rc = read_entry(&r, v->keys[i], v->items[i], &a->entries[i]))) return rc;
        raw->entry_scope[i] = tnr_json_get(v->items[i], "storage_scope")->s;
        raw->entry_dtype[i] = tnr_json_get(v->items[i], "dtype")->s;
    }
    /* pools */
    v = get(&r, g, "pools", "", &rc);
    if (rc || (rc = want(&r, v, TJ_ARRAY, "pools", "a list"))) return rc;
    a->npools = (int)v->len;
    a->pools = calloc(v->len ? v->len : 1, sizeof *a->pools);
    raw->pool_scope = calloc(v->len ? v->len : 1, sizeof(char *));
    raw->pool_dtype = calloc(v->len ? v->len : 1, sizeof(char *));
    if (!a->pools || !raw->pool_scope || !raw->pool_dtype) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
    for (i = 0; i < v->len; i++) {
        tj_value *q = v->items[i];
        tnr_pool *pool = &a->pools[i];
        snprintf(p, sizeof p, "pools[%zu]", i);
        if ((rc = want(&r, q, TJ_OBJECT, p, "an object")) || (rc = get_int(&r, q, "storage_id", p, &pool->id)) ||
            (rc = get_str(&r, q, "scope", p, &raw->pool_scope[i])) || (rc = get_str(&r, q, "dtype", p, &raw->pool_dtype[i])) ||
            (rc = get_ints(&r, q, "shape", p, pool->shape, &pool->nshape)))
            return rc;
        pool->texture = is_texture(raw->pool_scope[i]);
        pool->dtype = dtype_code(raw->pool_dtype[i]);
    }
    /* params, workspaces */
    for (k = 0; k < 2; k++) {
        const char *key = k ? "workspaces" : "params";
        tnr_blob **blobs = k ? &a->workspaces : &a->params;
        int *count = k ? &a->nworkspaces : &a->nparams;
        const char ***scopes = k ? &raw->ws_scope : &raw->param_scope, ***dtypes = k ? &raw->ws_dtype : &raw->param_dtype;
        v = get(&r, g, key, "", &rc);
        if (rc || (rc = want(&r, v, TJ_ARRAY, key, "a list"))) return rc;
        *count = (int)v->len;
        *blobs = calloc(v->len ? v->len : 1, sizeof **blobs);
        *scopes = calloc(v->len ? v->len : 1, sizeof(char *));
        *dtypes = calloc(v->len ? v->len : 1, sizeof(char *));
        if (!*blobs || !*scopes || !*dtypes) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
        for (i = 0; i < v->len; i++) {
            int scope_ok = 0;
            snprintf(p, sizeof p, "%s[%zu]", key, i);
            if ((rc = read_blob(&r, v->items[i], p, !k, &(*blobs)[i], &scope_ok))) return rc;
            (*scopes)[i] = tnr_json_get(v->items[i], "scope")->s;
            (*dtypes)[i] = tnr_json_get(v->items[i], "dtype")->s;
        }
    }
    v = tnr_json_get(g, "memory");
    if (v && (rc = want(&r, v, TJ_OBJECT, "memory", "an object"))) return rc;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * checks 3 to 10 */

static int check_shape(const tnr_artifact *a, const int64_t *s, int n, const char *where, char *err) {
    int i;
    int bad = n == 0;
    char text[200] = "";
    size_t used = 0;
    for (i = 0; i < n; i++) {
        if (s[i] < 1 || s[i] > MAX_DIM) bad = 1;
        if (used < sizeof text) used += (size_t)snprintf(text + used, sizeof text - used, "%s%lld", i ? ", " : "", (long long)s[i]);
    }
    if (bad) return graph_fail(a, err, "%s [%s] must hold integers from 1 to 2**31-1", where, text);
    return 0;
}

static uint64_t prod(const int64_t *s, int n) {
    uint64_t p = 1;
    int i;
    for (i = 0; i < n; i++) p = tnr_mul_sat(p, (uint64_t)s[i]);
    return p;
}

static int check_physical(const tnr_artifact *a, int texture, const int64_t *s, int n, size_t itemsize, const char *where,
                          const tnr_limits *lim, const char *dev, char *err) {
    int rc = check_shape(a, s, n, where, err);
    if (rc) return rc;
    if (texture) {
        if (n != 3 || s[2] != 4)
            return graph_fail(a, err, "%s of a texture must be [height, width, 4], has %d values", where, n);
        if ((uint64_t)s[1] > lim->image2d_max_width || (uint64_t)s[0] > lim->image2d_max_height)
            return graph_fail(a, err, "%s: a texture of %lld x %lld pixels exceeds %s's image2d limit %llu x %llu", where,
                              (long long)s[1], (long long)s[0], dev, (unsigned long long)lim->image2d_max_width,
                              (unsigned long long)lim->image2d_max_height);
    } else if (tnr_mul_sat(prod(s, n), itemsize) > lim->max_mem_alloc_bytes) {
        return graph_fail(a, err, "%s: a buffer of %llu bytes exceeds %s's max_mem_alloc_bytes %llu", where,
                          (unsigned long long)tnr_mul_sat(prod(s, n), itemsize), dev,
                          (unsigned long long)lim->max_mem_alloc_bytes);
    }
    return 0;
}

static int check_types_and_shapes(const tnr_artifact *a, const raw_strings *raw, const tnr_limits *lim, const char *dev,
                                  char *err) {
    int i, k, rc;
    char w[300];
    if (raw && a->dtype != TNR_F32 && a->dtype != TNR_F16)
        return graph_fail(a, err, "dtype '%.40s' is neither float32 nor float16", raw->dtype);
    for (i = 0; i < a->nentries; i++) {
        const tnr_entry *e = &a->entries[i];
        if (raw) {
            if (e->dtype < 0)
                return graph_fail(a, err, "entries['%.80s'].dtype '%.40s' is neither float32 nor float16", e->name,
                                  raw->entry_dtype[i]);
            if (e->pool == -2)
                return graph_fail(a, err, "entries['%.80s'] has scope '%.40s', neither 'global' nor 'texture*'", e->name,
                                  raw->entry_scope[i]);
        }
        snprintf(w, sizeof w, "entries['%.80s'].shape", e->name);
        if ((rc = check_shape(a, e->shape, e->ndim, w, err))) return rc;
        snprintf(w, sizeof w, "entries['%.80s'].physical_shape", e->name);
        if ((rc = check_physical(a, e->texture, e->phys, e->nphys, tnr_dtype_size(e->dtype), w, lim, dev, err))) return rc;
    }
    for (i = 0; i < a->npools; i++) {
        const tnr_pool *p = &a->pools[i];
        if (raw) {
            if (strcmp(raw->pool_scope[i], "global") != 0 && !p->texture)
                return graph_fail(a, err, "pools[%d] has scope '%.40s', neither 'global' nor 'texture*'", i, raw->pool_scope[i]);
            if (p->texture ? p->dtype != TNR_F32 && p->dtype != TNR_F16 : p->dtype != TNR_U8)
                return graph_fail(a, err, "pools[%d].dtype '%.40s' of a %.40s pool must be %s", i, raw->pool_dtype[i],
                                  raw->pool_scope[i], p->texture ? "float32 or float16" : "uint8");
        }
        snprintf(w, sizeof w, "pools[%d].shape", i);
        if ((rc = check_physical(a, p->texture, p->shape, p->nshape, 1, w, lim, dev, err))) return rc;
    }
    for (k = 0; k < 2; k++) {
        const char *kind = k ? "workspaces" : "params";
        const tnr_blob *blobs = k ? a->workspaces : a->params;
        int n = k ? a->nworkspaces : a->nparams;
        for (i = 0; i < n; i++) {
            const tnr_blob *b = &blobs[i];
            if (raw) {
                const char *scope = (k ? raw->ws_scope : raw->param_scope)[i];
                if (b->dtype < 0 || (b->dtype == TNR_I32 && (!k || b->texture)))
                    return graph_fail(a, err, "%s[%d] ('%.80s').dtype '%.40s' is neither float32 nor float16%s", kind,
                                      i, b->key, (k ? raw->ws_dtype : raw->param_dtype)[i],
                                      b->dtype == TNR_I32 ? " (int32: a workspace in a buffer only)" : "");
                if (strcmp(scope, "global") != 0 && !b->texture)
                    return graph_fail(a, err, "%s[%d] ('%.80s') has scope '%.40s', neither 'global' nor 'texture*'", kind,
                                      i, b->key, scope);
            }
            snprintf(w, sizeof w, "%s[%d] ('%.80s').physical_shape", kind, i, b->key);
            if ((rc = check_physical(a, b->texture, b->phys, b->nphys, tnr_dtype_size(b->dtype), w, lim, dev, err)))
                return rc;
        }
    }
    return 0;
}

static int check_pools(tnr_artifact *a, char *err) {
    int i, j;
    for (i = 0; i < a->npools; i++)
        for (j = 0; j < i; j++)
            if (a->pools[i].id == a->pools[j].id)
                return graph_fail(a, err, "pools: storage_id %lld repeats", (long long)a->pools[i].id);
    for (i = 0; i < a->nentries; i++) {
        tnr_entry *e = &a->entries[i];
        const tnr_pool *p = NULL;
        for (j = 0; j < a->npools; j++)
            if (a->pools[j].id == e->storage_id) {
                p = &a->pools[j];
                e->pool = j;
                break;
            }
        if (!p) return graph_fail(a, err, "entries['%.80s'].storage_id %lld names no pool", e->name, (long long)e->storage_id);
        if (p->texture != e->texture)
            return graph_fail(a, err, "entries['%.80s'] is a %s tensor in pool %lld, a %s pool", e->name,
                              e->texture ? "texture" : "global", (long long)p->id, p->texture ? "texture" : "global");
        if (p->texture) {
            if (e->phys[0] > p->shape[0] || e->phys[1] > p->shape[1] || e->dtype != p->dtype)
                return graph_fail(a, err, "entries['%.80s'] (%lld x %lld pixels, %s) does not fit its pool %lld (%lld x %lld, %s)",
                                  e->name, (long long)e->phys[1], (long long)e->phys[0], e->dtype ? "float16" : "float32",
                                  (long long)p->id, (long long)p->shape[1], (long long)p->shape[0],
                                  p->dtype ? "float16" : "float32");
        } else {
            if (p->nshape != 1)
                return graph_fail(a, err, "pools[%d].shape of a global pool must be [bytes], has %d values", j, p->nshape);
            if (tnr_mul_sat(e->elems, tnr_dtype_size(e->dtype)) > (uint64_t)p->shape[0])
                return graph_fail(a, err, "entries['%.80s'] needs %llu bytes, its pool %lld holds %lld", e->name,
                                  (unsigned long long)tnr_mul_sat(e->elems, tnr_dtype_size(e->dtype)), (long long)p->id,
                                  (long long)p->shape[0]);
        }
    }
    return 0;
}

static int check_params(tnr_artifact *a, char *err) {
    int i;
    for (i = 1; i < a->nparams; i++) {
        const tnr_blob *x = &a->params[a->param_sorted[i - 1]], *y = &a->params[a->param_sorted[i]];
        if (strcmp(x->key, y->key) == 0) {
            int first = a->param_sorted[i - 1] > a->param_sorted[i] ? a->param_sorted[i - 1] : a->param_sorted[i];
            return graph_fail(a, err, "params[%d]: key '%.80s' repeats", first, y->key);
        }
    }
    for (i = 0; i < a->nparams; i++) {
        const tnr_blob *b = &a->params[i];
        uint64_t want_bytes = tnr_mul_sat(b->elems, tnr_dtype_size(b->dtype));
        if (b->offset < 0 || b->offset % PARAM_ALIGN)
            return graph_fail(a, err, "params[%d] ('%.80s').offset %lld is not a multiple of %d", i, b->key,
                              (long long)b->offset, PARAM_ALIGN);
        if (b->nbytes < 0 || (uint64_t)b->nbytes != want_bytes)
            return graph_fail(a, err, "params[%d] ('%.80s').nbytes %lld is not %llu (its physical_shape in %s)", i, b->key,
                              (long long)b->nbytes, (unsigned long long)want_bytes, b->dtype ? "float16" : "float32");
        if ((uint64_t)b->offset + (uint64_t)b->nbytes > a->params_size)
            return graph_fail(a, err, "params[%d] ('%.80s') ends at byte %llu, past the end of params.bin (%zu bytes)", i,
                              b->key, (unsigned long long)((uint64_t)b->offset + (uint64_t)b->nbytes), a->params_size);
    }
    {
        /* overlap: sort by offset */
        int *order = malloc((size_t)(a->nparams ? a->nparams : 1) * sizeof *order), j;
        if (!order) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
        for (i = 0; i < a->nparams; i++) {
            int x = i;
            for (j = i; j > 0 && a->params[order[j - 1]].offset > a->params[x].offset; j--) order[j] = order[j - 1];
            order[j] = x;
        }
        for (i = 1; i < a->nparams; i++) {
            const tnr_blob *x = &a->params[order[i - 1]], *y = &a->params[order[i]];
            if (y->offset < x->offset + x->nbytes) {
                free(order);
                return graph_fail(a, err, "params '%.80s' and '%.80s' overlap in params.bin", x->key, y->key);
            }
        }
        free(order);
    }
    for (i = 1; i < a->nworkspaces; i++)
        if (strcmp(a->workspaces[a->ws_sorted[i - 1]].key, a->workspaces[a->ws_sorted[i]].key) == 0)
            return graph_fail(a, err, "workspaces: a key repeats ('%.80s')", a->workspaces[a->ws_sorted[i]].key);
    return 0;
}

static int check_io(tnr_artifact *a, tj_value *g, char *err) {
    int k;
    size_t i, j;
    for (k = 0; k < 2; k++) {
        const char *kind = k ? "outputs" : "inputs";
        tj_value *v = tnr_json_get(g, kind);
        int *idx;
        if (!v->len)
            return graph_fail(a, err, "%s is empty: the model has nothing to %s", kind, k ? "return" : "read");
        idx = malloc(v->len * sizeof *idx);
        if (!idx) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
        if (k) a->outputs = idx, a->noutputs = (int)v->len;
        else a->inputs = idx, a->ninputs = (int)v->len;
        for (i = 0; i < v->len; i++)
            for (j = 0; j < i; j++)
                if (strcmp(v->items[i]->s, v->items[j]->s) == 0)
                    return graph_fail(a, err, "%s repeats the name '%.80s'", kind, v->items[i]->s);
        for (i = 0; i < v->len; i++) {
            const char *name = v->items[i]->s;
            int e = lookup(a, a->entry_sorted, a->nentries, entry_name, name);
            const tnr_entry *en;
            if (e < 0) return graph_fail(a, err, "%s names '%.80s', which is no entry", kind, name);
            en = &a->entries[e];
            if (en->texture || en->elems != prod(en->shape, en->ndim))
                return graph_fail(a, err, "%s: '%.80s' must be a row-major global buffer, is a %s of %d physical dimensions",
                                  kind, name, en->texture ? "texture" : "buffer", en->nphys);
            idx[i] = e;
        }
    }
    return 0;
}

/* Whether `name` is a __kernel of src: the regex __kernel\b[^;{]*?\bvoid\s+NAME\s*\( of checks.py. */
static int is_ident(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static int defines_kernel(const char *src, size_t len, const char *name) {
    const char *p = src, *end = src + len;
    size_t nlen = strlen(name);
    for (;;) {
        const char *k = NULL, *q;
        int matched = 0;
        for (; p + 8 <= end; p++)
            if (memcmp(p, "__kernel", 8) == 0 && (p + 8 == end || !is_ident(p[8]))) {
                k = p;
                break;
            }
        if (!k) return 0;
        for (q = k + 8; q < end && *q != ';' && *q != '{'; q++) {
            const char *s = q + 4, *id, *t;
            if (q + 4 > end || memcmp(q, "void", 4) != 0 || is_ident(q[-1])) continue;
            if (s >= end || !is_space(*s)) continue;
            while (s < end && is_space(*s)) s++;
            if (s >= end || !is_ident(*s) || (*s >= '0' && *s <= '9')) continue;
            id = s;
            while (s < end && is_ident(*s)) s++;
            for (t = s; t < end && is_space(*t); t++) {
            }
            if (t >= end || *t != '(') continue;
            if ((size_t)(s - id) == nlen && memcmp(id, name, nlen) == 0) return 1;
            p = t + 1;
            matched = 1;
            break;
        }
        if (!matched) p = k + 8;
    }
}

static int check_calls(tnr_artifact *a, const tnr_limits *lim, const char *dev, int limits_only, char *err) {
    int i, j, k;
    if (!a->nnodes) return graph_fail(a, err, "nodes is empty");
    for (i = 0; i < a->nnodes; i++) {
        tnr_node *n = &a->nodes[i];
        char where[200];
        snprintf(where, sizeof where, "nodes[%d] ('%.80s')", i, n->name);
        if (!limits_only) {
            if (!kernel_file_ok(n->source) || n->source_index < 0)
                return graph_fail(a, err, "%s.source '%.80s' is not a kernel file of the manifest", where, n->source);
            if (!n->ncalls) return graph_fail(a, err, "%s has no call", where);
        }
        for (j = 0; j < n->ncalls; j++) {
            tnr_call *c = &n->calls[j];
            uint64_t largest = 1, wg, items, bound;
            const tnr_arg *small = NULL; /* the first argument smaller than its parameter addresses */
            char cw[260];
            snprintf(cw, sizeof cw, "%s.calls[%d]", where, j);
            if (!limits_only) {
                if (!defines_kernel(a->sources[n->source_index].text, a->sources[n->source_index].len, c->kernel))
                    return graph_fail(a, err, "%s: kernel '%.80s' is not defined in %s", cw, c->kernel,
                                      a->sources[n->source_index].path);
                if (c->nargs < 0)
                    return graph_fail(a, err, "%s: %d args for %d kernel parameters", cw, -c->nargs - 1,
                                      c->nargs == -1 ? 0 : c->args[0].index);
            }
            for (k = 0; k < c->nargs; k++) {
                tnr_arg *arg = &c->args[k];
                int texture, dtype, nphys;
                const int64_t *phys;
                uint64_t count;
                if (!limits_only) {
                    const char *ref = arg->ref;
                    arg->index = -1;
                    if (strncmp(ref, "t:", 2) == 0) {
                        arg->kind = TNR_ARG_ENTRY;
                        arg->index = lookup(a, a->entry_sorted, a->nentries, entry_name, ref + 2);
                    } else if (strncmp(ref, "p:", 2) == 0) {
                        arg->kind = TNR_ARG_PARAM;
                        arg->index = lookup(a, a->param_sorted, a->nparams, param_key, ref + 2);
                    } else if (strncmp(ref, "w:", 2) == 0) {
                        arg->kind = TNR_ARG_WORKSPACE;
                        arg->index = lookup(a, a->ws_sorted, a->nworkspaces, ws_key, ref + 2);
                    }
                    if (arg->index < 0)
                        return graph_fail(a, err, "%s: argument '%.80s' names no entry, param or workspace", cw, ref);
                }
                if (arg->kind == TNR_ARG_ENTRY) {
                    const tnr_entry *e = &a->entries[arg->index];
                    texture = e->texture, dtype = e->dtype, count = e->elems;
                    nphys = e->nphys, phys = e->phys;
                } else {
                    const tnr_blob *b = arg->kind == TNR_ARG_PARAM ? &a->params[arg->index] : &a->workspaces[arg->index];
                    texture = b->texture, dtype = b->dtype, count = b->elems;
                    nphys = b->nphys, phys = b->phys;
                }
                if (!limits_only) {
                    const char *want_type = dtype == TNR_F16 ? "half" : dtype == TNR_I32 ? "int" : "float";
                    if (arg->image != texture)
                        return graph_fail(a, err, "%s: parameter '%.80s' is an %s, argument '%.80s' a %s tensor", cw,
                                          arg->pname, arg->image ? "image" : "buffer", arg->ref, texture ? "texture" : "global");
                    if (!arg->image && (!arg->type || strcmp(arg->type, want_type) != 0))
                        return graph_fail(a, err, "%s: parameter '%.80s' holds %s, argument '%.80s' is %s", cw, arg->pname,
                                          arg->type ? arg->type : "None", arg->ref,
                                          dtype == TNR_F16 ? "float16" : dtype == TNR_I32 ? "int32" : "float32");
                    if (arg->kind == TNR_ARG_PARAM && arg->write)
                        return graph_fail(a, err, "%s: parameter '%.80s' writes the constant '%.80s'", cw, arg->pname, arg->ref);
                    /* the size its code addresses, as generated: a smaller argument would be read or written past
                     * (reported after the aliasing check below, as the Python runtime does) */
                    if (arg->image ? (nphys != 3 || phys[0] < arg->extent[0] || phys[1] < arg->extent[1])
                                   : count < (uint64_t)arg->extent[0])
                        small = small ? small : arg;
                }
                if (count > largest) largest = count;
            }
            if (!limits_only) { /* a written argument is passed once: no kernel reads and writes one tensor */
                for (k = 0; k < c->nargs; k++) {
                    int m;
                    if (!c->args[k].write) continue;
                    for (m = 0; m < c->nargs; m++)
                        if (m != k && strcmp(c->args[m].ref, c->args[k].ref) == 0)
                            return graph_fail(a, err, "%s: argument '%.80s' is written and also passed as another "
                                              "parameter (a kernel never reads and writes one tensor)", cw, c->args[k].ref);
                }
                if (small)
                    return graph_fail(a, err, "%s: argument '%.80s' is smaller than parameter '%.80s' addresses: the "
                                      "artifact was edited", cw, small->ref, small->pname);
            }
            /* check 9 */
            if (c->global[0] == -1 || c->global[0] < 1 || c->global[1] < 1 || c->global[2] < 1 || c->local[0] < 1 ||
                c->local[1] < 1 || c->local[2] < 1)
                return graph_fail(a, err, "%s: global_size and local_size must be three integers of at least 1", cw);
            for (k = 0; k < 3; k++)
                if (c->global[k] % c->local[k])
                    return graph_fail(a, err, "%s: local_size [%lld, %lld, %lld] does not divide global_size [%lld, %lld, %lld]",
                                      cw, (long long)c->local[0], (long long)c->local[1], (long long)c->local[2],
                                      (long long)c->global[0], (long long)c->global[1], (long long)c->global[2]);
            wg = prod(c->local, 3);
            if (wg > lim->max_work_group_size || (uint64_t)c->local[0] > lim->max_work_item_sizes[0] ||
                (uint64_t)c->local[1] > lim->max_work_item_sizes[1] || (uint64_t)c->local[2] > lim->max_work_item_sizes[2])
                return graph_fail(a, err, "%s: local_size [%lld, %lld, %lld] exceeds %s's work-group limits (%llu, [%llu, %llu, %llu])",
                                  cw, (long long)c->local[0], (long long)c->local[1], (long long)c->local[2], dev,
                                  (unsigned long long)lim->max_work_group_size,
                                  (unsigned long long)lim->max_work_item_sizes[0],
                                  (unsigned long long)lim->max_work_item_sizes[1],
                                  (unsigned long long)lim->max_work_item_sizes[2]);
            items = prod(c->global, 3);
            bound = tnr_mul_sat(LAUNCH_SLACK, largest);
            bound = bound == UINT64_MAX ? bound : tnr_mul_sat((bound + wg - 1) / wg, wg);
            if (items > bound)
                return graph_fail(a, err, "%s: global_size [%lld, %lld, %lld] launches %llu work-items for operands of at most %llu elements",
                                  cw, (long long)c->global[0], (long long)c->global[1], (long long)c->global[2],
                                  (unsigned long long)items, (unsigned long long)largest);
        }
    }
    return 0;
}

static int check_order(tnr_artifact *a, char *err) {
    unsigned char *ew = calloc((size_t)a->nentries + 1, 1), *ww = calloc((size_t)a->nworkspaces + 1, 1);
    int *last = malloc(sizeof(int) * ((size_t)a->npools + 1)); /* pool -> the entry written last into it */
    int i, j, k, rc = 0;
    if (!ew || !ww || !last) {
        free(ew);
        free(ww);
        free(last);
        return tnr_fail(err, TNR_E_NOMEM, "out of memory");
    }
    for (i = 0; i < a->npools; i++) last[i] = -1;
    for (i = 0; i < a->ninputs; i++) {
        ew[a->inputs[i]] = 1;
        last[a->entries[a->inputs[i]].pool] = a->inputs[i];
    }
    for (i = 0; i < a->nnodes && !rc; i++)
        for (j = 0; j < a->nodes[i].ncalls && !rc; j++) {
            const tnr_call *c = &a->nodes[i].calls[j];
            for (k = 0; k < c->nargs && !rc; k++) {
                const tnr_arg *arg = &c->args[k];
                int done = arg->kind == TNR_ARG_PARAM || (arg->kind == TNR_ARG_ENTRY ? ew[arg->index] : ww[arg->index]);
                if (!arg->write && !done)
                    rc = graph_fail(a, err, "nodes[%d] ('%.80s').calls[%d] reads '%.80s' before any call writes it", i,
                                    a->nodes[i].name, j, arg->ref);
            }
            for (k = 0; k < c->nargs && !rc; k++) {
                const tnr_arg *arg = &c->args[k];
                if (arg->write && arg->kind == TNR_ARG_ENTRY) {
                    ew[arg->index] = 1;
                    last[a->entries[arg->index].pool] = arg->index;
                }
                if (arg->write && arg->kind == TNR_ARG_WORKSPACE) ww[arg->index] = 1;
            }
        }
    for (i = 0; i < a->noutputs && !rc; i++) {
        const tnr_entry *y = &a->entries[a->outputs[i]];
        if (!ew[a->outputs[i]])
            rc = graph_fail(a, err, "output '%.80s' is never written", y->name);
        else if (last[y->pool] != a->outputs[i])  /* a later call wrote another entry into the output's pool */
            rc = graph_fail(a, err, "output '%.80s' is overwritten: '%.80s' is written into its pool (storage_id "
                            "%lld) after the output's last write", y->name, a->entries[last[y->pool]].name,
                            (long long)y->storage_id);
    }
    free(ew);
    free(ww);
    free(last);
    return rc;
}

/* Shape text "[a, b, c]" of n values. */
static const char *dims_text(const int64_t *v, int n, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "[");
    int i;
    for (i = 0; i < n && used < len; i++) used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)v[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

static int same_str(const char *x, const char *y) { return x == y || (x && y && !strcmp(x, y)); }

/* What the calls that write an entry reach: bytes lo..hi-1 of a buffer, pixels [xlo, xhi) x [ylo, yhi) of an image;
 * and at most how many elements (pixels) they write (-1: no bound known). */
typedef struct {
    int has, image, node, call;
    int64_t lo, hi, xlo, xhi, ylo, yhi, writes;
} hull;

/* Check 11 for one call: its signature is what the source declares, its local size the kernel's
 * reqd_work_group_size, and what the kernel's code addresses with this launch lies inside the arguments; what it
 * writes of each entry is added to hulls[entry]. */
static int check_call_bounds(tnr_artifact *a, tnr_bsrc *src, const char *perr, int pline, int i, int j, hull *hulls,
                             char *err) {
    const tnr_node *n = &a->nodes[i];
    const tnr_call *c = &n->calls[j];
    const char *path = a->sources[n->source_index].path;
    const tnr_bparam *ps;
    int np, has_reqd, k, line = 0, rc;
    int64_t reqd[3];
    char cw[300], what[600], b1[96], b2[96], b3[200], b4[200];
    tnr_brange *out, r;
    snprintf(cw, sizeof cw, "nodes[%d] ('%.80s').calls[%d]", i, n->name, j);
    if (!src || !tnr_bounds_kernel(src, c->kernel, &np, &ps, &has_reqd, reqd)) {
        if (src) snprintf(what, sizeof what, "no kernel '%.80s' is defined", c->kernel);
        else snprintf(what, sizeof what, "%s", perr), line = pline;
        goto cannot;
    }
    if (np != c->nargs)
        return graph_fail(a, err, "%s: %s declares %d parameters for '%.80s', the signature %d", cw, path, np, c->kernel,
                          c->nargs);
    for (k = 0; k < np; k++) {
        const tnr_arg *s = &c->args[k];
        const tnr_bparam *p = &ps[k];
        if (strcmp(p->name, s->pname) || p->image != s->image || !same_str(p->type, s->type) || p->write != s->write)
            return graph_fail(a, err, "%s: signature[%d] (%s %s '%.80s' of %s) is not what %s declares (%s %s '%.80s' of %s)", cw,
                              k, s->write ? "write" : "read", s->image ? "image" : "buffer", s->pname,
                              s->type ? s->type : "None", path, p->write ? "write" : "read", p->image ? "image" : "buffer",
                              p->name, p->type ? p->type : "None");
    }
    if (has_reqd && (reqd[0] != c->local[0] || reqd[1] != c->local[1] || reqd[2] != c->local[2]))
        return graph_fail(a, err, "%s: local_size %s is not the reqd_work_group_size %s that %s declares for '%.80s'", cw,
                          dims_text(c->local, 3, b1, sizeof b1), dims_text(reqd, 3, b2, sizeof b2), path, c->kernel);
    out = calloc((size_t)(np ? np : 1), sizeof *out);
    if (!out) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
    rc = tnr_bounds_analyse(src, c->kernel, c->global, c->local, out, &line, what, sizeof what);
    if (rc == TNR_E_NOMEM) {
        free(out);
        return tnr_fail(err, rc, "out of memory");
    }
    if (rc) {
        free(out);
        goto cannot;
    }
    for (k = 0; k < np; k++) {
        const tnr_arg *arg = &c->args[k];
        const int64_t *phys;
        uint64_t count, bytes;
        int dtype;
        if (arg->kind == TNR_ARG_ENTRY) {
            const tnr_entry *e = &a->entries[arg->index];
            count = e->elems, dtype = e->dtype, phys = e->phys;
        } else {
            const tnr_blob *bl = arg->kind == TNR_ARG_PARAM ? &a->params[arg->index] : &a->workspaces[arg->index];
            count = bl->elems, dtype = bl->dtype, phys = bl->phys;
        }
        bytes = tnr_mul_sat(count, tnr_dtype_size(dtype));
        r = out[k];
        if (r.has_range) {
            int64_t need = (r.hi + 1) * ps[k].elem_bytes;
            if (r.lo < 0 || (uint64_t)(need > 0 ? need : 0) > bytes) {
                free(out);
                return graph_fail(a, err, "%s: with global_size %s, kernel '%.80s' addresses %s[%lld..%lld] (%s), but argument "
                                  "'%.80s' holds %llu bytes: the artifact was edited", cw, dims_text(c->global, 3, b1, sizeof b1),
                                  c->kernel, tnr_printable(ps[k].name, strlen(ps[k].name), 80, b3, sizeof b3),
                                  (long long)r.lo, (long long)r.hi, ps[k].type, arg->ref, (unsigned long long)bytes);
            }
        }
        if (r.has_pixels) {
            int64_t h = phys[0], w = phys[1];
            if (r.xlo < 0 || r.ylo < 0 || r.xhi >= w || r.yhi >= h) {
                free(out);
                return graph_fail(a, err, "%s: with global_size %s, kernel '%.80s' addresses pixels x %lld..%lld, y %lld..%lld of "
                                  "image '%s', but argument '%.80s' is %lld x %lld pixels: the artifact was edited", cw,
                                  dims_text(c->global, 3, b1, sizeof b1), c->kernel, (long long)r.xlo,
                                  (long long)r.xhi, (long long)r.ylo, (long long)r.yhi,
                                  tnr_printable(ps[k].name, strlen(ps[k].name), 80, b4, sizeof b4), arg->ref,
                                  (long long)w, (long long)h);
            }
        }
        if (ps[k].write && arg->kind == TNR_ARG_ENTRY && (r.has_range || r.has_pixels)) {
            hull *hl = &hulls[arg->index];
            int64_t lo = r.lo * ps[k].elem_bytes, hi = (r.hi + 1) * ps[k].elem_bytes;
            if (!hl->has) {
                hl->has = 1, hl->image = ps[k].image;
                hl->lo = lo, hl->hi = hi;
                hl->xlo = r.xlo, hl->xhi = r.xhi + 1, hl->ylo = r.ylo, hl->yhi = r.yhi + 1;
                hl->writes = 0;
            } else if (ps[k].image) {
                if (r.xlo < hl->xlo) hl->xlo = r.xlo;
                if (r.ylo < hl->ylo) hl->ylo = r.ylo;
                if (r.xhi + 1 > hl->xhi) hl->xhi = r.xhi + 1;
                if (r.yhi + 1 > hl->yhi) hl->yhi = r.yhi + 1;
            } else {
                if (lo < hl->lo) hl->lo = lo;
                if (hi > hl->hi) hl->hi = hi;
            }
            if (hl->writes < 0 || r.writes < 0 || hl->writes + r.writes > TNR_BOUNDS_BIG) hl->writes = -1;
            else hl->writes += r.writes;
            hl->node = i, hl->call = j;
        }
    }
    free(out);
    return 0;
cannot:
    if (line) snprintf(b3, sizeof b3, ", line %d", line);
    else b3[0] = 0;
    return graph_fail(a, err, "%s: cannot tell what kernel '%.80s' (%s%s) addresses: %s; the source is not one the compiler "
                      "generates", cw, c->kernel, path, b3, what);
}

/* Check 11: each pool exactly as large as its largest entry, and what each kernel's source addresses. */
static int check_sizes(tnr_artifact *a, char *err) {
    int i, j, rc = 0;
    tnr_bsrc **parsed;
    char (*perr)[600];
    int *pline;
    hull *hulls;
    for (i = 0; i < a->npools; i++) {
        const tnr_pool *p = &a->pools[i];
        int64_t h = 0, w = 0;
        uint64_t bytes = 0;
        int users = 0;
        char b1[96], b2[96];
        for (j = 0; j < a->nentries; j++) {
            const tnr_entry *e = &a->entries[j];
            if (e->pool != i) continue;
            users++;
            if (p->texture) {
                if (e->phys[0] > h) h = e->phys[0];
                if (e->phys[1] > w) w = e->phys[1];
            } else if (tnr_mul_sat(e->elems, tnr_dtype_size(e->dtype)) > bytes) {
                bytes = tnr_mul_sat(e->elems, tnr_dtype_size(e->dtype));
            }
        }
        if (!users) return graph_fail(a, err, "pools[%d] (storage_id %lld) holds no entry", i, (long long)p->id);
        if (p->texture) {
            int64_t want[3] = {h, w, 4};
            if (p->nshape != 3 || p->shape[0] != h || p->shape[1] != w || p->shape[2] != 4)
                return graph_fail(a, err, "pools[%d].shape %s is not %s, the largest height and width of its entries", i,
                                  dims_text(p->shape, p->nshape, b1, sizeof b1), dims_text(want, 3, b2, sizeof b2));
        } else if (p->nshape != 1 || (uint64_t)p->shape[0] != bytes) {
            return graph_fail(a, err, "pools[%d].shape %s is not [%llu], the bytes of its largest entry", i,
                              dims_text(p->shape, p->nshape, b1, sizeof b1), (unsigned long long)bytes);
        }
    }
    parsed = calloc((size_t)a->nsources + 1, sizeof *parsed);
    perr = calloc((size_t)a->nsources + 1, sizeof *perr);
    pline = calloc((size_t)a->nsources + 1, sizeof *pline);
    hulls = calloc((size_t)a->nentries + 1, sizeof *hulls);
    if (!parsed || !perr || !pline || !hulls) {
        free(parsed), free(perr), free(pline), free(hulls);
        return tnr_fail(err, TNR_E_NOMEM, "out of memory");
    }
    for (i = 0; i < a->nsources && !rc; i++) {
        int used = 0;
        for (j = 0; j < a->nnodes && !used; j++) used = a->nodes[j].source_index == i;
        if (!used) continue;
        if (tnr_bounds_parse(a->sources[i].text, a->sources[i].len, &parsed[i], &pline[i], perr[i], sizeof perr[i]) ==
            TNR_E_NOMEM)
            rc = tnr_fail(err, TNR_E_NOMEM, "out of memory");
    }
    for (i = 0; i < a->nnodes && !rc; i++)
        for (j = 0; j < a->nodes[i].ncalls && !rc; j++) {
            int s = a->nodes[i].source_index;
            rc = check_call_bounds(a, parsed[s], perr[s], pline[s], i, j, hulls, err);
        }
    /* a launch reaches every byte (pixel) of a tensor it writes, first to last: no fewer work-items than the kernel
     * was generated for (a smaller launch leaves the rest of the tensor as it was) */
    for (i = 0; i < a->nentries && !rc; i++) {
        const tnr_entry *e = &a->entries[i];
        const hull *hl = &hulls[i];
        char cw[300];
        if (!hl->has) continue;
        snprintf(cw, sizeof cw, "nodes[%d] ('%.80s').calls[%d]", hl->node, a->nodes[hl->node].name, hl->call);
        if (hl->image) {
            if (hl->xlo != 0 || hl->ylo != 0 || hl->xhi != e->phys[1] || hl->yhi != e->phys[0])
                rc = graph_fail(a, err, "entries['%.80s']: the calls that write it reach pixels x %lld..%lld, y %lld..%lld of "
                                "its %lld x %lld (the last: %s): a launch does not cover the tensor it writes; the artifact "
                                "was edited", e->name, (long long)hl->xlo, (long long)hl->xhi - 1, (long long)hl->ylo,
                                (long long)hl->yhi - 1, (long long)e->phys[1], (long long)e->phys[0], cw);
        } else {
            int64_t bytes = (int64_t)tnr_mul_sat(e->elems, tnr_dtype_size(e->dtype));
            if (hl->lo != 0 || hl->hi != bytes)
                rc = graph_fail(a, err, "entries['%.80s']: the calls that write it reach bytes %lld..%lld of its %lld (the "
                                "last: %s): a launch does not cover the tensor it writes; the artifact was edited",
                                e->name, (long long)hl->lo, (long long)hl->hi - 1, (long long)bytes, cw);
        }
    }
    /* and they can write as many elements (pixels) as it has: the hull reaches the last byte through an index that
     * wraps (%) or is clamped even when work-groups are missing, but the work-items that can reach the stores, times
     * what each stores, bounds what is written (tnr_brange.writes) */
    for (i = 0; i < a->nentries && !rc; i++) {
        const tnr_entry *e = &a->entries[i];
        const hull *hl = &hulls[i];
        int64_t need;
        char cw[300];
        if (!hl->has || hl->writes < 0) continue;
        need = hl->image ? e->phys[0] * e->phys[1] : (int64_t)e->elems;
        if (hl->writes >= need) continue;
        snprintf(cw, sizeof cw, "nodes[%d] ('%.80s').calls[%d]", hl->node, a->nodes[hl->node].name, hl->call);
        rc = graph_fail(a, err, "entries['%.80s']: the calls that write it can write at most %lld of its %lld %s (the "
                        "last: %s): a launch smaller than the kernel was generated for; the artifact was edited",
                        e->name, (long long)hl->writes, (long long)need, hl->image ? "pixels" : "elements", cw);
    }
    for (i = 0; i < a->nsources; i++) tnr_bounds_free(parsed[i]);
    free(parsed), free(perr), free(pline), free(hulls);
    return rc;
}

/* Check 12: float32 lists exactly a float16 artifact's float32 entries, params and workspaces (a mixed plan's),
 * each once; a float32 artifact lists none. */
static int check_precision(tnr_artifact *a, tj_value *g, char *err) {
    rd r = {a, err};
    int rc = 0, k, i, n[3] = {a->nentries, a->nparams, a->nworkspaces};
    static const char *const prefix[3] = {"t:", "p:", "w:"};
    char *listed[3];
    size_t j;
    tj_value *v = get(&r, g, "float32", "", &rc);
    if (rc || (rc = want(&r, v, TJ_ARRAY, "float32", "a list"))) return rc;
    for (j = 0; j < v->len; j++) {
        char p[64];
        snprintf(p, sizeof p, "float32[%zu]", j);
        if ((rc = want(&r, v->items[j], TJ_STRING, p, "a string"))) return rc;
    }
    if (a->dtype != TNR_F16 && v->len)
        return graph_fail(a, err, "float32 lists %zu reference(s) in a float32 artifact, where every tensor is float32: "
                          "it must be empty", v->len);
    for (k = 0; k < 3; k++) {
        listed[k] = calloc((size_t)(n[k] ? n[k] : 1), 1);
        if (!listed[k]) {
            while (k-- > 0) free(listed[k]);
            return tnr_fail(err, TNR_E_NOMEM, "out of memory");
        }
    }
    for (j = 0; j < v->len && !rc; j++) {
        const char *ref = v->items[j]->s;
        int idx = -1;
        for (k = 0; k < 3 && idx < 0; k++) {
            if (strncmp(ref, prefix[k], 2) != 0) continue;
            idx = lookup(a, k == 0 ? a->entry_sorted : k == 1 ? a->param_sorted : a->ws_sorted, n[k],
                         k == 0 ? entry_name : k == 1 ? param_key : ws_key, ref + 2);
            if (idx >= 0 && k == 2 && a->workspaces[idx].dtype == TNR_I32) idx = -1; /* counters: no precision */
            if (idx >= 0) break;
        }
        if (idx < 0)
            rc = graph_fail(a, err, "float32[%zu] '%.80s' names no entry (t:), param (p:) or workspace (w:)", j, ref);
        else if (listed[k][idx])
            rc = graph_fail(a, err, "float32[%zu] '%.80s' is listed twice", j, ref);
        else
            listed[k][idx] = 1;
    }
    for (k = 0; k < 3 && !rc; k++)
        for (i = 0; i < n[k] && !rc; i++) {
            const char *name = k == 0 ? a->entries[i].name : k == 1 ? a->params[i].key : a->workspaces[i].key;
            int dtype = k == 0 ? a->entries[i].dtype : k == 1 ? a->params[i].dtype : a->workspaces[i].dtype;
            const char *dn = dtype == TNR_F16 ? "float16" : "float32";
            if (dtype == TNR_I32) continue; /* counters: no precision of their own */
            if (a->dtype != TNR_F16 && dtype != a->dtype)
                rc = graph_fail(a, err, "'%s%.80s' is %s in a float32 artifact", prefix[k], name, dn);
            else if (a->dtype == TNR_F16 && (dtype == TNR_F32) != listed[k][i])
                rc = graph_fail(a, err, "'%s%.80s' is %s but float32 %s it: the artifact's record of its precision is "
                                "not its storage", prefix[k], name, dn, listed[k][i] ? "lists" : "does not list");
        }
    for (k = 0; k < 3; k++) free(listed[k]);
    return rc;
}

int tnr_artifact_check_limits(const tnr_artifact *a, const tnr_limits *lim, const char *device_name, char *err) {
    int rc = check_types_and_shapes(a, NULL, lim, device_name, err);
    if (!rc) rc = check_calls((tnr_artifact *)a, lim, device_name, 1, err);
    return rc;
}

int tnr_artifact_load(const char *dir, tnr_artifact **out, char *err) {
    return tnr_artifact_load_key(dir, NULL, 0, out, err);
}

int tnr_artifact_load_key(const char *dir, const unsigned char *key, size_t keylen, tnr_artifact **out, char *err) {
    tnr_artifact *a = calloc(1, sizeof *a);
    int dfd = -1;
    unsigned char *graph = NULL;
    size_t graph_len = 0;
    listed *files = NULL;
    int nfiles = 0, rc, i;
    char jerr[256];
    raw_strings raw;
    struct stat st;
    memset(&raw, 0, sizeof raw);
    *out = NULL;
    if (!a) return tnr_fail(err, TNR_E_NOMEM, "out of memory");
    a->dir = strdup(dir);
    if (!a->dir) {
        free(a);
        return tnr_fail(err, TNR_E_NOMEM, "out of memory");
    }
    {
        size_t n = strlen(a->dir);
        while (n > 1 && a->dir[n - 1] == '/') a->dir[--n] = 0;
    }
    if (stat(a->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        rc = tnr_fail(err, TNR_E_ARTIFACT, "%s is not a compiled model: no such folder (make one with `tuner compile MODEL -o %s`)",
                      a->dir, a->dir);
        goto done;
    }
    /* check 1: every file read once, relative to the folder opened here */
    dfd = open(a->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        rc = tnr_fail(err, TNR_E_ARTIFACT, "%s cannot be opened (%s); " REDO, a->dir, strerror(errno));
        goto done;
    }
    rc = verify_manifest(a, dfd, key, keylen, &files, &nfiles, &graph, &graph_len, err);
    if (rc) goto done;
    /* check 2 */
    a->graph_doc = tnr_json_parse((const char *)graph, graph_len, MAX_GRAPH, jerr, sizeof jerr);
    if (!a->graph_doc) {
        rc = tnr_fail(err, TNR_E_ARTIFACT, "%s/graph.json is not valid JSON (%s); " REDO, a->dir, jerr);
        goto done;
    }
    rc = read_graph(a, tnr_json_root(a->graph_doc), &raw, err);
    if (rc) goto done;
    for (i = 0; i < a->nentries; i++) {
        tnr_entry *e = &a->entries[i];
        e->elems = prod(e->phys, e->nphys);
    }
    for (i = 0; i < a->nparams; i++) a->params[i].elems = prod(a->params[i].phys, a->params[i].nphys);
    for (i = 0; i < a->nworkspaces; i++) a->workspaces[i].elems = prod(a->workspaces[i].phys, a->workspaces[i].nphys);
    /* check 1, continued: every node's source is a kernel file of the manifest */
    for (i = 0; i < a->nnodes; i++) {
        tnr_node *n = &a->nodes[i];
        char rel[300];
        int s;
        snprintf(rel, sizeof rel, "kernels/%s", n->source);
        n->source_index = -1;
        if (!kernel_file_ok(n->source)) {
            rc = graph_fail(a, err, "nodes[%d].source '%.80s' is not a kernel file name (kNNN.cl under kernels/)", i,
                            n->source);
            goto done;
        }
        for (s = 0; s < a->nsources; s++)
            if (strcmp(a->sources[s].path, rel) == 0) n->source_index = s;
        if (n->source_index < 0) {
            rc = graph_fail(a, err, "nodes[%d] names %s, which manifest.json does not list", i, rel);
            goto done;
        }
        if (!tnr_is_text((const unsigned char *)a->sources[n->source_index].text, a->sources[n->source_index].len)) {
            rc = tnr_fail(err, TNR_E_ARTIFACT, "%s/%s is not text (UTF-8 without NUL); " REDO, a->dir,
                          a->sources[n->source_index].path);
            goto done;
        }
    }
    a->entry_sorted = sorted_index(a, a->nentries, entry_name);
    a->param_sorted = sorted_index(a, a->nparams, param_key);
    a->ws_sorted = sorted_index(a, a->nworkspaces, ws_key);
    if (!a->entry_sorted || !a->param_sorted || !a->ws_sorted) {
        rc = tnr_fail(err, TNR_E_NOMEM, "out of memory");
        goto done;
    }
    /* entries are named by their key */
    {
        tj_value *ents = tnr_json_get(tnr_json_root(a->graph_doc), "entries");
        for (i = 0; i < a->nentries; i++)
            if (strcmp(ents->keys[i], a->entries[i].name) != 0) {
                rc = graph_fail(a, err, "entries['%.80s'] is named '%.80s'", ents->keys[i], a->entries[i].name);
                goto done;
            }
    }
    /* checks 3 to 10 */
    if ((rc = check_types_and_shapes(a, &raw, &a->limits, "the device", err))) goto done;
    if ((rc = check_pools(a, err))) goto done;
    if ((rc = check_params(a, err))) goto done;
    if ((rc = check_io(a, tnr_json_root(a->graph_doc), err))) goto done;
    if ((rc = check_calls(a, &a->limits, "the device", 0, err))) goto done;
    if ((rc = check_order(a, err))) goto done;
    if ((rc = check_sizes(a, err))) goto done;
    if ((rc = check_precision(a, tnr_json_root(a->graph_doc), err))) goto done;
done:
    if (dfd >= 0) close(dfd);
    free(graph);
    free(files);
    free(raw.entry_scope), free(raw.entry_dtype), free(raw.pool_scope), free(raw.pool_dtype);
    free(raw.param_scope), free(raw.param_dtype), free(raw.ws_scope), free(raw.ws_dtype);
    if (rc) {
        tnr_artifact_free(a);
        return rc;
    }
    *out = a;
    return TNR_OK;
}

void tnr_artifact_free(tnr_artifact *a) {
    int i, j;
    if (!a) return;
    for (i = 0; i < a->nnodes; i++) {
        for (j = 0; j < a->nodes[i].ncalls; j++) free(a->nodes[i].calls[j].args);
        free(a->nodes[i].calls);
    }
    free(a->nodes);
    for (i = 0; i < a->nsources; i++) free(a->sources[i].text);
    free(a->sources);
    free(a->entries), free(a->pools), free(a->params), free(a->workspaces);
    free(a->inputs), free(a->outputs);
    free(a->entry_sorted), free(a->param_sorted), free(a->ws_sorted);
    free(a->params_bin);
    tnr_json_free(a->graph_doc);
    free(a->dir);
    free(a);
}
