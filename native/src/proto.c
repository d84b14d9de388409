#define _POSIX_C_SOURCE 200809L
#include "proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common.h"

const char *tpr_type_name(unsigned type) {
    static const char *names[] = {"?", "HELLO", "OPEN", "BUILD", "ALLOC", "WRITE", "READ", "FREE", "KERNEL", "RUN",
                                  "RESET", "PING", "BYE", "SENSORS", "CHALLENGE"};
    return type >= 1 && type <= TPR_LAST ? names[type] : "UNKNOWN";
}

const char *tpr_status_name(unsigned status) {
    static const char *names[] = {"OK", "BAD_REQUEST", "COMPILE", "RUNTIME", "TIMEOUT", "CRASHED", "NO_DEVICE", "AUTH"};
    return status <= TPR_AUTH ? names[status] : "UNKNOWN";
}

static void put16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}
static void put32(unsigned char *p, uint32_t v) {
    int i;
    for (i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint16_t get16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32); }

void tpr_pack_header(unsigned char out[TPR_HEADER], unsigned type, uint32_t rid, uint32_t word, uint64_t len) {
    memcpy(out, TPR_MAGIC, 4);
    put16(out + 4, TPR_VERSION);
    put16(out + 6, (uint16_t)type);
    put32(out + 8, rid);
    put32(out + 12, word);
    put64(out + 16, len);
}

void tpr_unpack_header(const unsigned char in[TPR_HEADER], tpr_header *h) {
    memcpy(h->magic, in, 4);
    h->version = get16(in + 4);
    h->type = get16(in + 6);
    h->rid = get32(in + 8);
    h->word = get32(in + 12);
    h->len = get64(in + 16);
}

const char *tpr_header_problem(const tpr_header *h) {
    if (memcmp(h->magic, TPR_MAGIC, 4) != 0) return "not an agent frame (its magic is not TNR1)";
    if (h->version != TPR_VERSION) return "another protocol version (this agent speaks version 1)";
    if (h->len > TPR_MAX_BODY) return "a frame body longer than 1 GiB";
    return NULL;
}

int tpr_read_full(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return got == 0 ? 1 : -1;
        got += (size_t)r;
    }
    return 0;
}

int tpr_write_full(int fd, const void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        done += (size_t)w;
    }
    return 0;
}

/* ---- reading bodies ---- */

void tpr_reader_init(tpr_reader *r, const unsigned char *p, size_t n) {
    r->p = p;
    r->n = n;
    r->i = 0;
    r->bad = 0;
    r->why[0] = 0;
}

static int take(tpr_reader *r, size_t n, const char *what) {
    if (r->bad) return 0;
    if (n > r->n - r->i) {
        r->bad = 1;
        snprintf(r->why, sizeof r->why, "the body ends inside a %s field (%zu bytes, %zu read)", what, r->n, r->i);
        return 0;
    }
    return 1;
}

uint32_t tpr_u32(tpr_reader *r) {
    uint32_t v;
    if (!take(r, 4, "u32")) return 0;
    v = get32(r->p + r->i);
    r->i += 4;
    return v;
}

uint64_t tpr_u64(tpr_reader *r) {
    uint64_t v;
    if (!take(r, 8, "u64")) return 0;
    v = get64(r->p + r->i);
    r->i += 8;
    return v;
}

double tpr_f64(tpr_reader *r) {
    uint64_t bits = tpr_u64(r);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

char *tpr_str(tpr_reader *r, size_t *len) {
    uint32_t n = tpr_u32(r);
    char *s;
    if (r->bad) return NULL;
    if (n > TPR_MAX_STR) {
        r->bad = 1;
        snprintf(r->why, sizeof r->why, "a string of %u bytes (at most %u)", n, TPR_MAX_STR);
        return NULL;
    }
    if (!take(r, n, "str")) return NULL;
    if (!tnr_is_text(r->p + r->i, n)) {
        r->bad = 1;
        snprintf(r->why, sizeof r->why, "a string that is not text (UTF-8 without NUL)");
        return NULL;
    }
    s = malloc((size_t)n + 1);
    if (!s) {
        r->bad = 1;
        snprintf(r->why, sizeof r->why, "out of memory for a string of %u bytes", n);
        return NULL;
    }
    memcpy(s, r->p + r->i, n);
    s[n] = 0;
    r->i += n;
    if (len) *len = n;
    return s;
}

const unsigned char *tpr_bytes(tpr_reader *r, uint64_t *len) {
    uint64_t n = tpr_u64(r);
    const unsigned char *p;
    *len = 0;
    if (r->bad) return NULL;
    if (n > (uint64_t)(r->n - r->i)) {
        r->bad = 1;
        snprintf(r->why, sizeof r->why, "a bytes field of %llu bytes where %zu are left", (unsigned long long)n,
                 r->n - r->i);
        return NULL;
    }
    p = r->p + r->i;
    r->i += (size_t)n;
    *len = n;
    return p;
}

int tpr_end(tpr_reader *r) {
    if (r->bad) return 0;
    if (r->i != r->n) {
        r->bad = 1;
        snprintf(r->why, sizeof r->why, "%zu bytes left over after the last field", r->n - r->i);
        return 0;
    }
    return 1;
}

/* ---- writing bodies ---- */

void tpr_put_raw(tpr_buf *b, const void *data, size_t n) {
    if (b->oom) return;
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 256;
        unsigned char *p;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = 1;
                return;
            }
            cap *= 2;
        }
        p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
}

void tpr_put_u32(tpr_buf *b, uint32_t v) {
    unsigned char p[4];
    put32(p, v);
    tpr_put_raw(b, p, 4);
}

void tpr_put_u64(tpr_buf *b, uint64_t v) {
    unsigned char p[8];
    put64(p, v);
    tpr_put_raw(b, p, 8);
}

void tpr_put_f64(tpr_buf *b, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    tpr_put_u64(b, bits);
}

/* Length of the UTF-8 character at p (1..4), 0 when p[0..n) does not start with one (or starts with NUL). */
static size_t char_len(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    size_t len;
    if (c == 0) return 0;
    if (c < 0x80) return 1;
    len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    return len && len <= n && tnr_is_text(p, len) ? len : 0;
}

void tpr_put_str(tpr_buf *b, const char *s, size_t n) {
    /* text only: an invalid byte (a driver's log in another encoding) becomes '?', a NUL a space; cut at the
     * limit on a character boundary */
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, at, out = 0;
    at = b->n;
    tpr_put_u32(b, 0);
    while (i < n && out < TPR_MAX_STR - 4) {
        size_t k = char_len(p + i, n - i);
        if (k) {
            tpr_put_raw(b, p + i, k);
            i += k;
            out += k;
        } else {
            tpr_put_raw(b, p[i] ? "?" : " ", 1);
            i++;
            out++;
        }
    }
    if (!b->oom) {
        unsigned char len[4];
        put32(len, (uint32_t)out);
        memcpy(b->p + at, len, 4);
    }
}

unsigned char *tpr_reserve(tpr_buf *b, size_t n) {
    size_t at = b->n;
    if (b->oom) return NULL;
    if (b->cap - b->n < n) {
        {
            size_t cap = b->cap ? b->cap : 256;
            unsigned char *q;
            while (cap - b->n < n) {
                if (cap > SIZE_MAX / 2) {
                    b->oom = 1;
                    return NULL;
                }
                cap *= 2;
            }
            q = realloc(b->p, cap);
            if (!q) {
                b->oom = 1;
                return NULL;
            }
            b->p = q;
            b->cap = cap;
        }
    }
    b->n += n;
    return b->p + at;
}

void tpr_put_cstr(tpr_buf *b, const char *s) { tpr_put_str(b, s, strlen(s)); }

void tpr_put_bytes(tpr_buf *b, const void *data, uint64_t n) {
    tpr_put_u64(b, n);
    tpr_put_raw(b, data, (size_t)n);
}

void tpr_buf_free(tpr_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int tpr_send(int fd, unsigned type, uint32_t rid, uint32_t word, const void *body, size_t len) {
    unsigned char head[TPR_HEADER];
    struct iovec v[2];
    size_t total = TPR_HEADER + len, done = 0;
    tpr_pack_header(head, type, rid, word, len);
    if (len < 65536) { /* small frames in one write */
        v[0].iov_base = head;
        v[0].iov_len = TPR_HEADER;
        v[1].iov_base = (void *)body;
        v[1].iov_len = len;
        while (done < total) {
            ssize_t w;
            if (done < TPR_HEADER) {
                v[0].iov_base = head + done;
                v[0].iov_len = TPR_HEADER - done;
                w = writev(fd, v, len ? 2 : 1);
            } else {
                w = write(fd, (const char *)body + (done - TPR_HEADER), total - done);
            }
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return -1;
            done += (size_t)w;
        }
        return 0;
    }
    if (tpr_write_full(fd, head, TPR_HEADER) != 0) return -1;
    return tpr_write_full(fd, body, len);
}

int tpr_send_error(int fd, unsigned type, uint32_t rid, unsigned status, const char *msg) {
    tpr_buf b = {0};
    int rc;
    tpr_put_cstr(&b, msg ? msg : "");
    rc = b.oom ? -1 : tpr_send(fd, type, rid, status, b.p, b.n);
    tpr_buf_free(&b);
    return rc;
}
