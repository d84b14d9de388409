#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

struct tj_doc {
    chunk *chunks;
    tj_value *root;
};

typedef struct {
    tj_doc *doc;
    const char *p, *start, *end;
    char *err;
    size_t errlen;
    int failed;
} parser;

static void *arena(tj_doc *doc, size_t n) {
    chunk *c = doc->chunks;
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = malloc(sizeof(chunk) + cap);
        if (!c) return NULL;
        c->next = doc->chunks;
        c->used = 0;
        c->cap = cap;
        doc->chunks = c;
    }
    c->used += n;
    return (char *)c->data + c->used - n;
}

static void fail(parser *ps, const char *what) {
    int line = 1, col = 1;
    const char *q;
    if (ps->failed) return;
    ps->failed = 1;
    for (q = ps->start; q < ps->p && q < ps->end; q++) {
        if (*q == '\n') line++, col = 1;
        else col++;
    }
    snprintf(ps->err, ps->errlen, "line %d column %d: %s", line, col, what);
}

static void ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static tj_value *new_value(parser *ps, tj_type t) {
    tj_value *v = arena(ps->doc, sizeof *v);
    if (!v) {
        fail(ps, "out of memory");
        return NULL;
    }
    memset(v, 0, sizeof *v);
    v->type = t;
    return v;
}

static int hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    int i;
    for (i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

/* Length of a valid UTF-8 sequence at p (0 when invalid). */
static size_t utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    size_t n, i;
    unsigned cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
    else return 0;
    if ((size_t)(end - p) < n) return 0;
    for (i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static const char *parse_string(parser *ps, size_t *outlen) {
    const char *q = ps->p + 1; /* after the quote */
    size_t cap = 0;
    char *out, *o;
    /* first pass: find the end and validate raw bytes, bounding the decoded size */
    while (q < ps->end && *q != '"') {
        unsigned char c = (unsigned char)*q;
        if (c < 0x20) {
            ps->p = q;
            fail(ps, "control character in a string");
            return NULL;
        }
        if (c == '\\') {
            q += 2;
            cap += 4;
            continue;
        }
        if (c >= 0x80) {
            size_t n = utf8_len((const unsigned char *)q, (const unsigned char *)ps->end);
            if (!n) {
                ps->p = q;
                fail(ps, "invalid UTF-8 in a string");
                return NULL;
            }
            q += n, cap += n;
            continue;
        }
        q++, cap++;
    }
    if (q >= ps->end) {
        fail(ps, "unterminated string");
        return NULL;
    }
    out = arena(ps->doc, cap + 1);
    if (!out) {
        fail(ps, "out of memory");
        return NULL;
    }
    o = out;
    q = ps->p + 1;
    while (*q != '"') {
        if (*q != '\\') {
            *o++ = *q++;
            continue;
        }
        q++;
        switch (*q) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (ps->end - q < 5 || !hex4(q + 1, &cp)) {
                ps->p = q;
                fail(ps, "bad \\u escape");
                return NULL;
            }
            q += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (ps->end - q < 7 || q[1] != '\\' || q[2] != 'u' || !hex4(q + 3, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    ps->p = q;
                    fail(ps, "unpaired surrogate in a \\u escape");
                    return NULL;
                }
                q += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                ps->p = q;
                fail(ps, "unpaired surrogate in a \\u escape");
                return NULL;
            } else if (cp == 0) {
                ps->p = q;
                fail(ps, "\\u0000 in a string");
                return NULL;
            }
            o += put_utf8(o, cp);
            break;
        }
        default:
            ps->p = q;
            fail(ps, "bad escape in a string");
            return NULL;
        }
        q++;
    }
    *o = 0;
    *outlen = (size_t)(o - out);
    ps->p = q + 1;
    return out;
}

static tj_value *parse_value(parser *ps, int depth);

static tj_value *parse_number(parser *ps) {
    const char *q = ps->p, *s = ps->p;
    int integral = 1;
    char buf[64];
    tj_value *v;
    if (*q == '-') q++;
    if (q < ps->end && *q == '0') q++;
    else if (q < ps->end && *q >= '1' && *q <= '9')
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    else {
        fail(ps, "bad number");
        return NULL;
    }
    if (q < ps->end && *q == '.') {
        integral = 0;
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            ps->p = q;
            fail(ps, "bad number: digits must follow '.'");
            return NULL;
        }
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        integral = 0;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            ps->p = q;
            fail(ps, "bad number: digits must follow the exponent");
            return NULL;
        }
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if ((size_t)(q - s) >= sizeof buf) {
        fail(ps, "number too long");
        return NULL;
    }
    memcpy(buf, s, (size_t)(q - s));
    buf[q - s] = 0;
    v = new_value(ps, TJ_NUMBER);
    if (!v) return NULL;
    v->d = strtod(buf, NULL);
    if (!isfinite(v->d)) {
        fail(ps, "number out of range");
        return NULL;
    }
    if (integral) {
        /* exact int64 parse */
        const char *r = buf;
        int neg = *r == '-';
        uint64_t acc = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        int fits = 1;
        if (neg) r++;
        for (; *r; r++) {
            unsigned dgt = (unsigned)(*r - '0');
            if (acc > (lim - dgt) / 10) {
                fits = 0;
                break;
            }
            acc = acc * 10 + dgt;
        }
        if (fits) {
            v->is_int = 1;
            v->i = neg ? (acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc) : (int64_t)acc;
        }
    }
    ps->p = q;
    return v;
}

static int push(parser *ps, tj_value ***items, const char ***keys, size_t *n, size_t *cap, tj_value *v, const char *k) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        tj_value **ni = arena(ps->doc, nc * sizeof *ni);
        const char **nk = keys ? arena(ps->doc, nc * sizeof *nk) : NULL;
        if (!ni || (keys && !nk)) {
            fail(ps, "out of memory");
            return 0;
        }
        if (*n) {
            memcpy(ni, *items, *n * sizeof *ni);
            if (keys) memcpy(nk, *keys, *n * sizeof *nk);
        }
        *items = ni;
        if (keys) *keys = nk;
        *cap = nc;
    }
    (*items)[*n] = v;
    if (keys) (*keys)[*n] = k;
    (*n)++;
    return 1;
}

static tj_value *parse_array(parser *ps, int depth) {
    tj_value *v = new_value(ps, TJ_ARRAY);
    size_t cap = 0;
    if (!v) return NULL;
    ps->p++;
    ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
        return v;
    }
    for (;;) {
        tj_value *item = parse_value(ps, depth + 1);
        if (!item || !push(ps, &v->items, NULL, &v->len, &cap, item, NULL)) return NULL;
        ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            ws(ps);
            continue;
        }
        if (ps->p < ps->end && *ps->p == ']') {
            ps->p++;
            return v;
        }
        fail(ps, "expected ',' or ']' in an array");
        return NULL;
    }
}

static tj_value *parse_object(parser *ps, int depth) {
    tj_value *v = new_value(ps, TJ_OBJECT);
    size_t cap = 0, i;
    if (!v) return NULL;
    ps->p++;
    ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return v;
    }
    for (;;) {
        const char *key, *at;
        size_t klen;
        tj_value *item;
        if (ps->p >= ps->end || *ps->p != '"') {
            fail(ps, "expected a string key in an object");
            return NULL;
        }
        at = ps->p;
        key = parse_string(ps, &klen);
        if (!key) return NULL;
        if (strlen(key) != klen) {
            fail(ps, "NUL in a key");
            return NULL;
        }
        for (i = 0; i < v->len; i++)
            if (strcmp(v->keys[i], key) == 0) {
                char msg[160];
                ps->p = at;
                snprintf(msg, sizeof msg, "duplicate key \"%.100s\"", key);
                fail(ps, msg);
                return NULL;
            }
        ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') {
            fail(ps, "expected ':' after a key");
            return NULL;
        }
        ps->p++;
        ws(ps);
        item = parse_value(ps, depth + 1);
        if (!item || !push(ps, &v->items, &v->keys, &v->len, &cap, item, key)) return NULL;
        ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            ws(ps);
            continue;
        }
        if (ps->p < ps->end && *ps->p == '}') {
            ps->p++;
            return v;
        }
        fail(ps, "expected ',' or '}' in an object");
        return NULL;
    }
}

static int literal(parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, word, n) == 0) {
        ps->p += n;
        return 1;
    }
    return 0;
}

static tj_value *parse_value(parser *ps, int depth) {
    tj_value *v;
    if (depth > TJ_MAX_DEPTH) {
        fail(ps, "nested deeper than 64 levels");
        return NULL;
    }
    if (ps->p >= ps->end) {
        fail(ps, "unexpected end of text");
        return NULL;
    }
    switch (*ps->p) {
    case '{': return parse_object(ps, depth);
    case '[': return parse_array(ps, depth);
    case '"': {
        size_t len = 0;
        const char *s;
        v = new_value(ps, TJ_STRING);
        if (!v) return NULL;
        s = parse_string(ps, &len);
        if (!s) return NULL;
        v->s = s;
        v->len = len;
        return v;
    }
    case 't':
    case 'f':
        if (literal(ps, "true") || literal(ps, "false")) {
            v = new_value(ps, TJ_BOOL);
            if (v) v->d = ps->p[-1] == 'e' && ps->p[-2] == 'u';
            return v;
        }
        break;
    case 'n':
        if (literal(ps, "null")) return new_value(ps, TJ_NULL);
        break;
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) return parse_number(ps);
    }
    fail(ps, "unexpected character");
    return NULL;
}

tj_doc *tnr_json_parse(const char *text, size_t len, size_t max_len, char *err, size_t errlen) {
    parser ps;
    tj_doc *doc;
    if (len > max_len) {
        snprintf(err, errlen, "%zu bytes, more than the limit of %zu", len, max_len);
        return NULL;
    }
    doc = calloc(1, sizeof *doc);
    if (!doc) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    memset(&ps, 0, sizeof ps);
    ps.doc = doc;
    ps.p = ps.start = text;
    ps.end = text + len;
    ps.err = err;
    ps.errlen = errlen;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        fail(&ps, "a byte order mark");
        tnr_json_free(doc);
        return NULL;
    }
    ws(&ps);
    doc->root = parse_value(&ps, 1);
    if (doc->root) {
        ws(&ps);
        if (ps.p != ps.end) fail(&ps, "text after the JSON value");
    }
    if (ps.failed || !doc->root) {
        if (!ps.failed) fail(&ps, "no JSON value");
        tnr_json_free(doc);
        return NULL;
    }
    return doc;
}

tj_value *tnr_json_root(tj_doc *doc) { return doc->root; }

void tnr_json_free(tj_doc *doc) {
    chunk *c;
    if (!doc) return;
    c = doc->chunks;
    while (c) {
        chunk *next = c->next;
        free(c);
        c = next;
    }
    free(doc);
}

tj_value *tnr_json_get(const tj_value *v, const char *key) {
    size_t i;
    if (!v || v->type != TJ_OBJECT) return NULL;
    for (i = 0; i < v->len; i++)
        if (strcmp(v->keys[i], key) == 0) return v->items[i];
    return NULL;
}

const char *tnr_json_type_name(tj_type t) {
    static const char *names[] = {"null", "a boolean", "a number", "a string", "a list", "an object"};
    return names[t];
}
