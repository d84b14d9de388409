#define _POSIX_C_SOURCE 200809L
#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "half.h"

#define NPY_MAX_BYTES ((size_t)1 << 34)

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n')) p++;
    return p;
}

/* Finds 'key': in the header dict and returns a pointer to the value (NULL when absent). */
static const char *dict_value(const char *h, const char *end, const char *key) {
    char quoted[32];
    const char *p;
    size_t n;
    snprintf(quoted, sizeof quoted, "'%s'", key);
    n = strlen(quoted);
    for (p = h; p + n <= end; p++)
        if (memcmp(p, quoted, n) == 0) {
            p = skip_ws(p + n, end);
            if (p < end && *p == ':') return skip_ws(p + 1, end);
            return NULL;
        }
    return NULL;
}

int tnr_npy_read(const char *path, tnr_npy *out, char *err) {
    unsigned char *buf = NULL;
    size_t len = 0, hlen, off, itemsize, i;
    const char *h, *hend, *v;
    int half, rc;
    memset(out, 0, sizeof *out);
    rc = tnr_read_file(path, NPY_MAX_BYTES, &buf, &len, err);
    if (rc) return rc;
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
        free(buf);
        return tnr_fail(err, TNR_E_ARG, "%s: not a .npy file", path);
    }
    if (buf[6] == 1) hlen = (size_t)buf[8] | (size_t)buf[9] << 8, off = 10;
    else if ((buf[6] == 2 || buf[6] == 3) && len >= 12)
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24, off = 12;
    else {
        free(buf);
        return tnr_fail(err, TNR_E_ARG, "%s: unsupported .npy version %d", path, buf[6]);
    }
    if (hlen > len - off) {
        free(buf);
        return tnr_fail(err, TNR_E_ARG, "%s: truncated .npy header", path);
    }
    h = (const char *)buf + off;
    hend = h + hlen;
    v = dict_value(h, hend, "descr");
    if (v && hend - v >= 5 && (memcmp(v, "'<f4'", 5) == 0 || memcmp(v, "'<f2'", 5) == 0)) {
        half = v[3] == '2';
    } else {
        free(buf);
        return tnr_fail(err, TNR_E_ARG, "%s: holds %s values; float32 or float16 (little-endian) expected", path,
                        v ? "other" : "unknown");
    }
    v = dict_value(h, hend, "fortran_order");
    if (!v || hend - v < 5 || memcmp(v, "False", 5) != 0) {
        free(buf);
        return tnr_fail(err, TNR_E_ARG, "%s: not in C order (fortran_order must be False)", path);
    }
    v = dict_value(h, hend, "shape");
    if (!v || v >= hend || *v != '(') {
        free(buf);
        return tnr_fail(err, TNR_E_ARG, "%s: no shape in the .npy header", path);
    }
    v++;
    out->count = 1;
    for (;;) {
        char *e;
        long long d;
        v = skip_ws(v, hend);
        if (v < hend && *v == ')') break;
        if (out->ndim == TNR_NPY_MAX_DIMS) {
            free(buf);
            return tnr_fail(err, TNR_E_ARG, "%s: more than %d dimensions", path, TNR_NPY_MAX_DIMS);
        }
        errno = 0;
        d = strtoll(v, &e, 10);
        if (e == v || e > hend || d < 0 || errno) {
            free(buf);
            return tnr_fail(err, TNR_E_ARG, "%s: bad shape in the .npy header", path);
        }
        out->shape[out->ndim++] = d;
        out->count = (size_t)tnr_mul_sat(out->count, (uint64_t)d);
        v = skip_ws(e, hend);
        if (v < hend && *v == ',') v++;
        else if (!(v < hend && *v == ')')) {
            free(buf);
            return tnr_fail(err, TNR_E_ARG, "%s: bad shape in the .npy header", path);
        }
    }
    itemsize = half ? 2 : 4;
    off += hlen;
    if (out->count > (len - off) / itemsize || (len - off) != out->count * itemsize) {
        free(buf);
        return tnr_fail(err, TNR_E_ARG, "%s: %zu bytes of data, the header's shape needs %zu", path, len - off,
                        (size_t)tnr_mul_sat(out->count, itemsize));
    }
    out->data = malloc(out->count ? out->count * sizeof(float) : 1);
    if (!out->data) {
        free(buf);
        return tnr_fail(err, TNR_E_NOMEM, "%s: out of memory", path);
    }
    for (i = 0; i < out->count; i++) {
        const unsigned char *p = buf + off + i * itemsize;
        if (half) {
            uint16_t x = (uint16_t)(p[0] | p[1] << 8);
            out->data[i] = tnr_half_to_float(x);
        } else {
            uint32_t x = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            memcpy(&out->data[i], &x, 4);
        }
    }
    free(buf);
    return TNR_OK;
}

int tnr_npy_write(const char *path, const float *data, const int64_t *shape, int ndim, char *err) {
    char header[512], dims[400] = "";
    size_t n = 1, used = 0, hl, total;
    int i;
    FILE *f;
    for (i = 0; i < ndim; i++) {
        used += (size_t)snprintf(dims + used, sizeof dims - used, "%lld%s", (long long)shape[i],
                                 ndim == 1 ? "," : i + 1 < ndim ? ", " : "");
        n *= (size_t)shape[i];
    }
    hl = (size_t)snprintf(header + 10, sizeof header - 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }",
                          dims);
    total = 10 + hl + 1;
    while (total % 64) header[10 + hl++] = ' ', total++;
    header[10 + hl++] = '\n';
    memcpy(header, "\x93NUMPY\x01\x00", 8);
    header[8] = (char)(hl & 0xFF);
    header[9] = (char)(hl >> 8);
    f = fopen(path, "wb");
    if (!f) return tnr_fail(err, TNR_E_IO, "%s: cannot write (%s)", path, strerror(errno));
    /* little-endian hosts only (x86-64, arm64): the floats go out as they are */
    if (fwrite(header, 1, 10 + hl, f) != 10 + hl || fwrite(data, sizeof(float), n, f) != n) {
        fclose(f);
        return tnr_fail(err, TNR_E_IO, "%s: write failed", path);
    }
    if (fclose(f) != 0) return tnr_fail(err, TNR_E_IO, "%s: write failed (%s)", path, strerror(errno));
    return TNR_OK;
}

void tnr_npy_free(tnr_npy *a) {
    free(a->data);
    a->data = NULL;
}
