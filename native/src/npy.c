#define _POSIX_C_SOURCE 200809L
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "half.h"

#define NPY_MAX_BYTES ((size_t)1 << 34)

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* The header's dictionary, read whole: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } with each of
 * the three keys exactly once and nothing else (numpy would keep the last of a repeated key: a file that names
 * one twice is refused, so no two readers see two arrays in it). Returns NULL, or what is wrong. */
static const char *parse_header(const char *h, const char *end, int *half, tnr_npy *out) {
    const char *p = skip_ws(h, end);
    int seen[3] = {0, 0, 0};
    if (p >= end || *p != '{') return "not a dictionary";
    p = skip_ws(p + 1, end);
    while (p < end && *p != '}') {
        static const char *const keys[3] = {"descr", "fortran_order", "shape"};
        const char *k0;
        char quote;
        size_t klen;
        int which = -1, i;
        if (*p != '\'' && *p != '"') return "a key that is not a string";
        quote = *p++;
        k0 = p;
        while (p < end && *p != quote) p++;
        if (p >= end) return "an unterminated key";
        klen = (size_t)(p - k0);
        p++;
        for (i = 0; i < 3; i++)
            if (strlen(keys[i]) == klen && !memcmp(k0, keys[i], klen)) which = i;
        if (which < 0) return "a key other than 'descr', 'fortran_order' and 'shape'";
        if (seen[which]++) return which == 0 ? "'descr' twice" : which == 1 ? "'fortran_order' twice" : "'shape' twice";
        p = skip_ws(p, end);
        if (p >= end || *p != ':') return "a key without ':'";
        p = skip_ws(p + 1, end);
        if (which == 0) {
            if (end - p >= 5 && (!memcmp(p, "'<f4'", 5) || !memcmp(p, "\"<f4\"", 5))) *half = 0;
            else if (end - p >= 5 && (!memcmp(p, "'<f2'", 5) || !memcmp(p, "\"<f2\"", 5))) *half = 1;
            else return "values other than float32 or float16 (little-endian): descr must be '<f4' or '<f2'";
            p += 5;
        } else if (which == 1) {
            if (end - p >= 5 && !memcmp(p, "False", 5)) p += 5;
            else if (end - p >= 4 && !memcmp(p, "True", 4)) return "Fortran order (fortran_order must be False)";
            else return "a fortran_order that is not False";
        } else {
            if (p >= end || *p != '(') return "a shape that is not a tuple";
            p++;
            out->count = 1;
            out->ndim = 0;
            for (;;) {
                long long d = 0;
                int digits = 0;
                const char *d0;
                p = skip_ws(p, end);
                if (p < end && *p == ')') break;
                if (out->ndim == TNR_NPY_MAX_DIMS) return "more than 8 dimensions";
                d0 = p;
                while (p < end && *p >= '0' && *p <= '9' && digits < 18) d = d * 10 + (*p++ - '0'), digits++;
                /* plain decimal integers as numpy writes them: no sign, no leading zero, at most 18 digits (an int64) */
                if (!digits || (p < end && *p >= '0' && *p <= '9') || (digits > 1 && *d0 == '0'))
                    return "a shape of other than integers";
                out->shape[out->ndim++] = d;
                out->count = (size_t)tnr_mul_sat(out->count, (uint64_t)d);
                p = skip_ws(p, end);
                if (p < end && *p == ',') p++;
                else if (!(p < end && *p == ')')) return "a shape of other than integers";
                else if (out->ndim == 1) return "a shape '(N)' that is not a tuple (one dimension is written '(N,)')";
            }
            p++;
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',') p = skip_ws(p + 1, end);
        else if (!(p < end && *p == '}')) return "entries not separated by ','";
    }
    if (p >= end) return "an unterminated dictionary";
    p = skip_ws(p + 1, end);
    if (p != end) return "bytes after the dictionary";
    if (!seen[0] || !seen[1] || !seen[2]) return "not the keys 'descr', 'fortran_order' and 'shape'";
    return NULL;
}

int tnr_npy_read(const char *path, size_t max_bytes, tnr_npy *out, char *err) {
    unsigned char *buf = NULL;
    size_t len = 0, hlen, off, itemsize, i;
    const char *why;
    int half = 0, rc;
    memset(out, 0, sizeof *out);
    if (!max_bytes || max_bytes > NPY_MAX_BYTES) max_bytes = NPY_MAX_BYTES;
    rc = tnr_read_file(path, max_bytes, &buf, &len, err); /* non-blocking, a regular file, at most max_bytes */
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
    why = parse_header((const char *)buf + off, (const char *)buf + off + hlen, &half, out);
    if (why) {
        free(buf);
        return tnr_fail(err, TNR_E_ARG, "%s: its .npy header holds %s; save the input again with numpy.save (float32)",
                        path, why);
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

static int write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* path's folder ("." when it names none; no trailing '/', so that O_NOFOLLOW applies to its last component) and
 * base name, into dir[n] and *base */
static int split_path(const char *path, char *dir, size_t n, const char **base) {
    const char *slash = strrchr(path, '/');
    size_t len;
    if (!slash) {
        snprintf(dir, n, ".");
        *base = path;
        return 1;
    }
    len = (size_t)(slash - path);
    while (len > 0 && path[len - 1] == '/') len--;
    if (len == 0) len = 1; /* "/y.npy": the root */
    if (len >= n) return 0;
    memcpy(dir, path, len);
    dir[len] = 0;
    *base = slash + 1;
    return 1;
}

/* The destination's folder, opened without following a symbolic link at its own name (O_NOFOLLOW): everything
 * below is created and renamed relative to that descriptor, so a link another user plants as the folder (or swaps
 * in later) never redirects the write. Links above the folder are the user's path and followed. */
static int open_folder(const char *path, const char *dir, int *dfd, char *err) {
    struct stat ls;
    int e;
    *dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*dfd >= 0) return TNR_OK;
    e = errno;
    if (lstat(dir, &ls) == 0 && S_ISLNK(ls.st_mode)) {
        char target[1024];
        ssize_t t = readlink(dir, target, sizeof target - 1);
        target[t > 0 ? t : 0] = 0;
        return tnr_fail(err, TNR_E_IO, "%s: its folder '%s' is a symbolic link (to '%s'); give the folder itself", path,
                        dir, target);
    }
    if (e == ENOENT) return tnr_fail(err, TNR_E_IO, "%s: its folder '%s' does not exist", path, dir);
    if (e == ENOTDIR) return tnr_fail(err, TNR_E_IO, "%s: '%s' is not a folder", path, dir);
    return tnr_fail(err, TNR_E_IO, "%s: cannot open its folder '%s' (%s)", path, dir, strerror(e));
}

/* An existing destination that is not a regular file (a device, a FIFO): written through in place, never replaced.
 * Opened non-blocking (a FIFO that no process reads is refused, never waited on) and without following a link, and
 * checked on the descriptor: a FIFO or device of another user (not root) is refused, as one another user planted
 * in a shared folder would take the output (or stall the run). */
static int write_through(int dfd, const char *path, const char *base, const void *header, size_t hl, const float *data,
                         size_t n, char *err) {
    struct stat st;
    int fd = openat(dfd, base, O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC), fl;
    if (fd < 0) {
        int e = errno;
        if (e == ENXIO)
            return tnr_fail(err, TNR_E_IO, "%s: it is a FIFO (named pipe) that no process reads; start its reader first, "
                            "or give a file path", path);
        return tnr_fail(err, TNR_E_IO, "%s: cannot write (%s)", path, strerror(e));
    }
    if (fstat(fd, &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) {
        close(fd);
        return tnr_fail(err, TNR_E_IO, "%s: it changed while it was opened; write again", path);
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        close(fd);
        return tnr_fail(err, TNR_E_IO, "%s: it is %s of another user (uid %ld), not written through; give a file path",
                        path, tnr_file_kind((unsigned)st.st_mode), (long)st.st_uid);
    }
    fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return tnr_fail(err, TNR_E_IO, "%s: cannot write (%s)", path, strerror(e));
    }
    /* little-endian hosts only (x86-64, arm64): the floats go out as they are */
    if (write_all(fd, header, hl) || write_all(fd, data, n * sizeof(float))) {
        int e = errno;
        close(fd);
        return tnr_fail(err, TNR_E_IO, "%s: write failed (%s)", path, strerror(e));
    }
    close(fd);
    return TNR_OK;
}

int tnr_npy_write(const char *path, const float *data, const int64_t *shape, int ndim, char *err) {
    char header[512], dims[400] = "", dir[4096], tmp[4200];
    const char *base;
    size_t n = 1, used = 0, hl, total;
    int i, fd = -1, dfd, tries, rc;
    struct stat st;
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
    /* as tuner run writes (tuner/files.py write_file): the folder opened without following a link at its name, and
     * everything done relative to it; a symbolic link at the name is refused, a device or FIFO written through, anything
     * else written to a new file beside it and renamed into place once complete and synced */
    if (!split_path(path, dir, sizeof dir, &base) || !*base)
        return tnr_fail(err, TNR_E_IO, "%s: not a file path", path);
    if ((rc = open_folder(path, dir, &dfd, err)) != TNR_OK) return rc;
    if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISLNK(st.st_mode)) {
            char target[1024];
            ssize_t t = readlinkat(dfd, base, target, sizeof target - 1);
            target[t > 0 ? t : 0] = 0;
            close(dfd);
            return tnr_fail(err, TNR_E_IO, "%s: it is a symbolic link (to '%s'); give the path of the file itself", path,
                            target);
        }
        if (S_ISDIR(st.st_mode)) {
            close(dfd);
            return tnr_fail(err, TNR_E_IO, "%s: it is a directory; give a file path", path);
        }
        if (!S_ISREG(st.st_mode)) {
            rc = write_through(dfd, path, base, header, 10 + hl, data, n, err);
            close(dfd);
            return rc;
        }
    } else if (errno != ENOENT) {
        int e = errno;
        close(dfd);
        return tnr_fail(err, TNR_E_IO, "%s: cannot write (%s)", path, strerror(e));
    }
    for (tries = 0; tries < 100 && fd < 0; tries++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (snprintf(tmp, sizeof tmp, ".%s.%ld.%lx.tmp", base, (long)getpid(),
                     (unsigned long)(ts.tv_nsec ^ (tries * 2654435761u))) >= (int)sizeof tmp) {
            close(dfd);
            return tnr_fail(err, TNR_E_IO, "%s: the path is too long", path);
        }
        /* a new file of our own: a link or file planted at the name is never followed or reused */
        fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) {
            int e = errno;
            close(dfd);
            return tnr_fail(err, TNR_E_IO, "%s: cannot write (%s)", path, strerror(e));
        }
    }
    if (fd < 0) {
        close(dfd);
        return tnr_fail(err, TNR_E_IO, "%s: cannot write (no free temporary name beside it)", path);
    }
    if (write_all(fd, header, 10 + hl) || write_all(fd, data, n * sizeof(float)) || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlinkat(dfd, tmp, 0);
        close(dfd);
        return tnr_fail(err, TNR_E_IO, "%s: write failed (%s); the file there is left as it was", path, strerror(e));
    }
    if (close(fd) != 0 || renameat(dfd, tmp, dfd, base) != 0) {
        int e = errno;
        unlinkat(dfd, tmp, 0);
        close(dfd);
        return tnr_fail(err, TNR_E_IO, "%s: write failed (%s); the file there is left as it was", path, strerror(e));
    }
    fsync(dfd); /* the rename on the disk too (best effort) */
    close(dfd);
    return TNR_OK;
}

void tnr_npy_free(tnr_npy *a) {
    free(a->data);
    a->data = NULL;
}
