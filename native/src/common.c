#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tnr_fail(char *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, TNR_ERRLEN, fmt, ap);
        va_end(ap);
    }
    return code;
}

void tnr_prefix(char *err, const char *fmt, ...) {
    char head[TNR_ERRLEN], old[TNR_ERRLEN];
    va_list ap;
    if (!err) return;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%s", err);
    snprintf(err, TNR_ERRLEN, "%s: %s", head, old);
}

const char *tnr_file_kind(unsigned mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO (named pipe)" : S_ISCHR(mode) ? "a character device"
         : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : "a special file";
}

int tnr_read_file(const char *path, size_t max, unsigned char **data, size_t *len, char *err) {
    struct stat st;
    int rc;
    /* O_NONBLOCK: opening a FIFO must not hang; fstat on the descriptor then refuses it as not a regular file, and
     * a file larger than max before a byte of it is read (a 3 GiB sparse file is never read) */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    *data = NULL;
    *len = 0;
    if (fd < 0)
        return tnr_fail(err, TNR_E_IO, "%s: %s", path, errno == ENOENT ? "no such file" : strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tnr_fail(err, TNR_E_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tnr_fail(err, TNR_E_IO, "%s: it is %s, not a regular file", path, tnr_file_kind((unsigned)st.st_mode));
    }
    if ((uint64_t)st.st_size > (uint64_t)max) {
        close(fd);
        return tnr_fail(err, TNR_E_IO, "%s: it holds %lld bytes, more than the %zu it may", path,
                        (long long)st.st_size, max);
    }
    switch ((rc = tnr_read_fd(fd, (size_t)st.st_size, data))) {
    case 0: break;
    case -1: return tnr_fail(err, TNR_E_NOMEM, "%s: out of memory reading %lld bytes", path, (long long)st.st_size);
    default: return tnr_fail(err, TNR_E_IO, "%s: read failed (%s)", path, rc == -2 ? "file shrank" : strerror(rc));
    }
    *len = (size_t)st.st_size;
    return TNR_OK;
}

int tnr_read_fd(int fd, size_t size, unsigned char **data) {
    size_t got = 0;
    unsigned char *buf = malloc(size + 1);
    *data = NULL;
    if (!buf) {
        close(fd);
        return -1;
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r <= 0) {
            int e = r ? errno : -2;
            free(buf);
            close(fd);
            return e ? e : EIO;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[got] = 0;
    *data = buf;
    return 0;
}

void tnr_log_line(const char *who, const char *fmt, va_list ap) {
    char line[TNR_ERRLEN + 64];
    int n = snprintf(line, sizeof line, "%s[%ld]: ", who, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof line - 2) n = 0;
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    strcat(line, "\n");
    if (write(2, line, strlen(line)) < 0) { /* nothing to do: the log is best effort */
    }
}

char *tnr_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    s[a] = '/';
    memcpy(s + a + 1, name, b + 1);
    return s;
}

uint64_t tnr_mul_sat(uint64_t a, uint64_t b) {
    if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
    return a * b;
}

int tnr_is_text(const unsigned char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t len, k;
        if (c == 0) return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || n - i < len) return 0;
        for (k = 1; k < len; k++)
            if ((p[i + k] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] > 0x9F) || (c == 0xF0 && p[i + 1] < 0x90) ||
            (c == 0xF4 && p[i + 1] > 0x8F))
            return 0;
        i += len;
    }
    return 1;
}

size_t tnr_join3(char *buf, size_t cap, const char *a, const char *b, const char *c) {
    const char *parts[3] = {a, b, c};
    size_t n = 0;
    int k;
    for (k = 0; k < 3; k++) {
        size_t len = strlen(parts[k]);
        if (k && n < cap) buf[n++] = 0;
        if (len > cap - n) len = cap - n;
        memcpy(buf + n, parts[k], len);
        n += len;
    }
    return n;
}

const char *tnr_printable(const char *s, size_t len, size_t max, char *buf, size_t n) {
    const unsigned char *c = (const unsigned char *)s;
    size_t used = 0, k;
    if (!n) return buf;
    for (k = 0; k < len && k < max && used + 8 < n; k++) {
        if (c[k] < 0x20 || c[k] == 0x7f || (c[k] == 0xc2 && k + 1 < len && c[k + 1] >= 0x80 && c[k + 1] <= 0x9f))
            used += (size_t)snprintf(buf + used, n - used, "\\x%02x", c[k] == 0xc2 ? c[++k] : c[k]);
        else
            buf[used++] = (char)c[k];
    }
    snprintf(buf + used, n - used, "%s", k < len ? "..." : "");
    return buf;
}

int tnr_mkdirs(const char *path, unsigned mode) {
    char tmp[4096];
    size_t i, n = strlen(path);
    if (n >= sizeof tmp) return errno = ENAMETOOLONG, -1;
    memcpy(tmp, path, n + 1);
    for (i = 1; i <= n; i++)
        if (tmp[i] == '/' || tmp[i] == 0) {
            char c = tmp[i];
            tmp[i] = 0;
            if (mkdir(tmp, (mode_t)mode) != 0 && errno != EEXIST) return -1;
            tmp[i] = c;
        }
    return 0;
}
