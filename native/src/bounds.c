/* What a kernel addresses (bounds.h): tuner/artifact/bounds.py in C, function for function and rule for rule,
 * so both runtimes accept and refuse the same sources. Values are int32 intervals, float intervals (doubles)
 * or unknown; every allocation lives in one arena per source (parsing) or per analysis, freed whole; a failure
 * deep in the recursion leaves by longjmp to the entry point. */
#define _POSIX_C_SOURCE 200809L
#include "bounds.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define I32MIN (-2147483648LL)
#define I32MAX 2147483647LL
#define BIG TNR_BOUNDS_BIG
#define MAX_DEPTH 100   /* nesting of parentheses, unary operators and statements */
#define MAX_HEIGHT 1000 /* a kernel's syntax tree: every recursive walk of it is at most that deep */
#define MAX_TOKENS 4000000

/* ---- arena ------------------------------------------------------------------------------------------------ */

typedef struct bchunk {
    struct bchunk *next;
    size_t used, cap;
    max_align_t data[];
} bchunk;

typedef struct {
    bchunk *head;
} barena;

static void *arena_get(barena *a, size_t n) {
    bchunk *c = a->head;
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 262144 ? n : 262144;
        c = malloc(sizeof(bchunk) + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    c->used += n;
    return (char *)c->data + c->used - n;
}

static void arena_free(barena *a) {
    while (a->head) {
        bchunk *n = a->head->next;
        free(a->head);
        a->head = n;
    }
}

/* ---- failures --------------------------------------------------------------------------------------------- */

typedef struct {
    jmp_buf jb;
    int line, nomem;
    char what[512];
    barena *ar;
} bctx;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4), noreturn))
#endif
static void bfail(bctx *c, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->what, sizeof c->what, fmt, ap);
    va_end(ap);
    c->line = line;
    longjmp(c->jb, 1);
}

static void *bmem(bctx *c, size_t n) {
    void *p = arena_get(c->ar, n);
    if (!p) {
        c->nomem = 1;
        bfail(c, 0, "out of memory");
    }
    memset(p, 0, n);
    return p;
}

/* A name as the messages show it: 60 bytes at most, control characters escaped. */
static const char *shown(const char *s, char *buf, size_t n) { return tnr_printable(s, strlen(s), 60, buf, n); }

/* ---- symbols: every identifier interned; the keywords first, at fixed ids -------------------------------- */

enum {
    K_IF, K_ELSE, K_FOR, K_RETURN, K_BREAK, K_CONTINUE, K_WHILE, K_DO, K_SWITCH, K_GOTO, K_CASE, K_DEFAULT,
    K_TYPEDEF, K_STRUCT, K_UNION, K_ENUM, K_ATTRIBUTE, K_ASM, K_SIZEOF, K_KERNEL_, K_KERNEL, K_VOID, K_CONSTANT_,
    K_CONSTANT, K_SAMPLER_T, K_IMAGE2D_T, K_REQD, K_CONST, K_UNSIGNED, K_SIGNED, K_WRITE_ONLY_, K_WRITE_ONLY,
    K_READ_WRITE_, K_READ_WRITE, K_RESTRICT, K_VOLATILE,
    /* integer types, in the order of int_types[] */
    K_CHAR, K_UCHAR, K_SHORT, K_USHORT, K_INT, K_BOOL, K_UINT, K_LONG, K_ULONG, K_SIZE_T, K_PTRDIFF_T, K_INTPTR_T,
    K_UINTPTR_T,
    K_FLOAT, K_DOUBLE, K_HALF,
    K_CLAMP_, K_CLAMP_EDGE, K_REPEAT, K_MIRRORED, K_NONE,
    K_COUNT
};

static const char *const keywords[K_COUNT] = {
    "if", "else", "for", "return", "break", "continue", "while", "do", "switch", "goto", "case", "default",
    "typedef", "struct", "union", "enum", "__attribute__", "asm", "sizeof", "__kernel", "kernel", "void",
    "__constant", "constant", "sampler_t", "image2d_t", "reqd_work_group_size", "const", "unsigned", "signed",
    "__write_only", "write_only", "__read_write", "read_write", "restrict", "volatile",
    "char", "uchar", "short", "ushort", "int", "bool", "uint", "long", "ulong", "size_t", "ptrdiff_t", "intptr_t",
    "uintptr_t",
    "float", "double", "half",
    "CLK_ADDRESS_CLAMP", "CLK_ADDRESS_CLAMP_TO_EDGE", "CLK_ADDRESS_REPEAT", "CLK_ADDRESS_MIRRORED_REPEAT",
    "CLK_ADDRESS_NONE"};

/* integer types: the values a variable of the type holds (int32 at most; has 0: a wider type, unknown) */
static const struct {
    int has;
    int64_t lo, hi;
    int is_unsigned;
} int_types[] = {{1, -128, 127, 0}, {1, 0, 255, 1}, {1, -32768, 32767, 0}, {1, 0, 65535, 1}, {1, I32MIN, I32MAX, 0},
                 {1, 0, 1, 1}, {0, 0, 0, 1}, {0, 0, 0, 0}, {0, 0, 0, 1}, {0, 0, 0, 1}, {0, 0, 0, 0}, {0, 0, 0, 0},
                 {0, 0, 0, 1}};

static const char *const other_types[] = {"void", "sampler_t", "image2d_t", "image1d_t", "image3d_t", "image2d_array_t",
                                          "image1d_buffer_t", "image1d_array_t", "event_t"};
static const char *const qualifiers[] = {"const", "volatile", "restrict", "__local", "local", "__private", "private",
                                         "__global", "global", "__constant", "constant", "__read_only", "read_only",
                                         "__write_only", "write_only", "__read_write", "read_write", "unsigned",
                                         "signed"};

enum { SF_TYPEWORD = 1, SF_QUALIFIER = 2, SF_INT = 4, SF_FLOAT = 8 };

typedef struct {
    char **names;
    unsigned char *flags;
    int n, cap;
    int *table; /* open addressing: symbol id + 1, 0 empty */
    size_t tcap;
} bsyms;

static uint64_t hash_str(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static int in_list(const char *s, const char *const *list, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (!strcmp(s, list[i])) return 1;
    return 0;
}

/* ^(?:u?(?:char|short|int|long)|float|half|double)(?:2|3|4|8|16)$ */
static int is_vector_type(const char *s) {
    static const char *const bases[] = {"uchar", "ushort", "uint", "ulong", "char", "short", "int", "long", "float",
                                        "half", "double"};
    static const char *const widths[] = {"2", "3", "4", "8", "16"};
    size_t i, j, n = strlen(s);
    for (i = 0; i < sizeof bases / sizeof *bases; i++) {
        size_t m = strlen(bases[i]);
        if (n > m && !strncmp(s, bases[i], m))
            for (j = 0; j < 5; j++)
                if (!strcmp(s + m, widths[j])) return 1;
    }
    return 0;
}

static int int_type_index(int sym) { return sym >= K_CHAR && sym <= K_UINTPTR_T ? sym - K_CHAR : -1; }
static int is_float_type(int sym) { return sym == K_FLOAT || sym == K_DOUBLE || sym == K_HALF; }

static int intern(bctx *c, bsyms *t, const char *s, size_t n) {
    size_t i;
    int id;
    if ((size_t)(t->n + 1) * 2 > t->tcap) {
        size_t cap = t->tcap ? t->tcap * 2 : 1024, k;
        int *table = calloc(cap, sizeof *table);
        if (!table) bfail((c->nomem = 1, c), 0, "out of memory");
        for (k = 0; k < (size_t)t->n; k++) {
            size_t j = hash_str(t->names[k], strlen(t->names[k])) & (cap - 1);
            while (table[j]) j = (j + 1) & (cap - 1);
            table[j] = (int)k + 1;
        }
        free(t->table);
        t->table = table;
        t->tcap = cap;
    }
    i = hash_str(s, n) & (t->tcap - 1);
    while (t->table[i]) {
        const char *name = t->names[t->table[i] - 1];
        if (strlen(name) == n && !memcmp(name, s, n)) return t->table[i] - 1;
        i = (i + 1) & (t->tcap - 1);
    }
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 256;
        char **names = realloc(t->names, (size_t)cap * sizeof *names);
        unsigned char *flags;
        if (!names) bfail((c->nomem = 1, c), 0, "out of memory");
        t->names = names;
        flags = realloc(t->flags, (size_t)cap);
        if (!flags) bfail((c->nomem = 1, c), 0, "out of memory");
        t->flags = flags;
        t->cap = cap;
    }
    id = t->n;
    t->names[id] = bmem(c, n + 1);
    memcpy(t->names[id], s, n);
    t->names[id][n] = 0;
    {
        const char *name = t->names[id];
        unsigned char f = 0;
        if (int_type_index(id) >= 0 || (id >= K_CHAR && id <= K_UINTPTR_T)) f |= SF_INT;
        if (is_float_type(id)) f |= SF_FLOAT;
        if (in_list(name, qualifiers, sizeof qualifiers / sizeof *qualifiers)) f |= SF_QUALIFIER;
        if ((f & (SF_INT | SF_FLOAT | SF_QUALIFIER)) || in_list(name, other_types, sizeof other_types / sizeof *other_types) ||
            is_vector_type(name))
            f |= SF_TYPEWORD;
        t->flags[id] = f;
    }
    t->table[i] = id + 1;
    t->n++;
    return id;
}

/* ---- tokens ----------------------------------------------------------------------------------------------- */

enum { T_END, T_ID, T_NUM, T_OP };

/* operators, longest first where one is a prefix of another */
static const char *const ops[] = {"<<=", ">>=", "++", "--", "&&", "||", "<=", ">=", "==", "!=", "<<", ">>", "+=", "-=",
                                  "*=", "/=", "%=", "&=", "|=", "^=", "->", "-", "+", "*", "/", "%", "<", ">", "=",
                                  "!", "&", "|", "^", "~", "?", ":", ";", ",", ".", "(", ")", "[", "]", "{", "}"};
#define NOPS ((int)(sizeof ops / sizeof *ops))

typedef struct {
    unsigned char kind;
    int line;
    int v;          /* T_ID: symbol; T_OP: index into ops */
    const char *s;  /* T_NUM: the text */
    int len;
} btok;

static int is_alpha(int ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_digit(int ch) { return ch >= '0' && ch <= '9'; }
static int is_hex(int ch) { return is_digit(ch) || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'); }

struct tnr_bsrc;

typedef struct {
    btok *t;
    int n, cap;
} btoks;

static void push_tok(bctx *c, btoks *ts, btok t) {
    if (ts->n == ts->cap) {
        int cap = ts->cap ? ts->cap * 2 : 4096;
        btok *m = realloc(ts->t, (size_t)cap * sizeof *m);
        if (!m) bfail((c->nomem = 1, c), 0, "out of memory");
        ts->t = m;
        ts->cap = cap;
    }
    ts->t[ts->n++] = t;
}

/* what clang would read otherwise than the analysis does, refused before anything is read (bounds.py _LEXICAL): a
 * lone carriage return, a backslash at the end of a line (spaces between), a "??" (a trigraph) */
static void lexical(bctx *c, const char *src, size_t n) {
    size_t pos;
    int line = 1;
    for (pos = 0; pos < n; pos++) {
        char ch = src[pos];
        if (ch == '\n') line++;
        else if (ch == '\r' && !(pos + 1 < n && src[pos + 1] == '\n'))
            bfail(c, line, "a carriage return not followed by a line feed");
        else if (ch == '\\') {
            size_t q = pos + 1;
            while (q < n && (src[q] == ' ' || src[q] == '\t' || src[q] == '\f' || src[q] == '\v')) q++;
            if (q == n || src[q] == '\r' || src[q] == '\n') bfail(c, line, "a backslash at the end of a line");
        } else if (ch == '?' && pos + 1 < n && src[pos + 1] == '?')
            bfail(c, line, "the trigraph sequence '?" "?'");
    }
}

static void tokenize(bctx *c, bsyms *syms, const char *src, size_t n, btoks *ts) {
    size_t pos = 0;
    int line = 1;
    lexical(c, src, n);
    while (pos < n) {
        char ch = src[pos];
        btok t;
        if (pos == 0 || src[pos - 1] == '\n') { /* ^[ \t]*#[ \t]*([A-Za-z]*)[^\n]* at a line's start */
            size_t q = pos;
            while (q < n && (src[q] == ' ' || src[q] == '\t')) q++;
            if (q < n && src[q] == '#') {
                size_t w, e;
                q++;
                while (q < n && (src[q] == ' ' || src[q] == '\t')) q++;
                w = q;
                while (q < n && ((src[q] >= 'a' && src[q] <= 'z') || (src[q] >= 'A' && src[q] <= 'Z'))) q++;
                e = q;
                while (q < n && src[q] != '\n') q++;
                if (e - w != 6 || memcmp(src + w, "pragma", 6) != 0 || src[q - 1] == '\\')
                    bfail(c, line, "the preprocessor directive #%.*s", (int)(e - w > 40 ? 40 : e - w), src + w);
                for (w = pos; w + 1 < q; w++)
                    if (src[w] == '/' && src[w + 1] == '*') bfail(c, line, "a comment in a preprocessor directive");
                pos = q;
                continue;
            }
        }
        if (ch == '\n') {
            line++;
            pos++;
            continue;
        }
        if (ch == ' ' || ch == '\t' || ch == '\r' || ch == '\f' || ch == '\v') {
            pos++;
            continue;
        }
        if (ch == '/' && pos + 1 < n && src[pos + 1] == '/') {
            while (pos < n && src[pos] != '\n') pos++;
            continue;
        }
        if (ch == '/' && pos + 1 < n && src[pos + 1] == '*') {
            size_t q = pos + 2;
            int lines = 0;
            while (q + 1 < n && !(src[q] == '*' && src[q + 1] == '/')) lines += src[q++] == '\n';
            if (q + 1 < n) {
                line += lines;
                pos = q + 2;
                continue;
            } /* unterminated: '/' is an operator, as the Python tokenizer has it */
        }
        memset(&t, 0, sizeof t);
        t.line = line;
        if (is_alpha(ch)) {
            size_t q = pos;
            while (q < n && (is_alpha(src[q]) || is_digit(src[q]))) q++;
            t.kind = T_ID;
            t.v = intern(c, syms, src + pos, q - pos);
            pos = q;
        } else if (is_digit(ch) || (ch == '.' && pos + 1 < n && is_digit(src[pos + 1]))) {
            size_t q = pos;
            if (ch == '0' && q + 2 < n && (src[q + 1] == 'x' || src[q + 1] == 'X') && is_hex(src[q + 2])) {
                q += 2;
                while (q < n && is_hex(src[q])) q++;
            } else {
                while (q < n && is_digit(src[q])) q++;
                if (q < n && src[q] == '.') {
                    q++;
                    while (q < n && is_digit(src[q])) q++;
                }
                if (q < n && (src[q] == 'e' || src[q] == 'E')) {
                    size_t r = q + 1;
                    if (r < n && (src[r] == '+' || src[r] == '-')) r++;
                    if (r < n && is_digit(src[r])) {
                        q = r;
                        while (q < n && is_digit(src[q])) q++;
                    }
                }
            }
            while (q < n && ((src[q] >= 'a' && src[q] <= 'z') || (src[q] >= 'A' && src[q] <= 'Z'))) q++;
            t.kind = T_NUM;
            t.s = src + pos;
            t.len = (int)(q - pos);
            pos = q;
        } else {
            int k, found = -1;
            char nx = pos + 1 < n ? src[pos + 1] : 0;
            if ((ch == '<' && (nx == ':' || nx == '%')) || (ch == ':' && nx == '>') ||
                (ch == '%' && (nx == '>' || nx == ':')))
                bfail(c, line, "the digraph '%c%c'", ch, nx);
            for (k = 0; k < NOPS && found < 0; k++) {
                size_t m = strlen(ops[k]);
                if (pos + m <= n && !memcmp(src + pos, ops[k], m)) found = k;
            }
            if (found < 0) {
                if ((unsigned char)ch >= 0x20 && (unsigned char)ch < 0x7f) bfail(c, line, "the character '%c'", ch);
                bfail(c, line, "the character '\\x%02x'", (unsigned char)ch);
            }
            t.kind = T_OP;
            t.v = found;
            pos += strlen(ops[found]);
        }
        push_tok(c, ts, t);
        if (ts->n > MAX_TOKENS) bfail(c, line, "more than 4,000,000 tokens");
    }
    {
        btok e;
        int k;
        memset(&e, 0, sizeof e);
        e.kind = T_END;
        e.line = line;
        for (k = 0; k < 8; k++) push_tok(c, ts, e); /* p + k stays inside for k < 8 */
    }
}

/* ---- the syntax tree -------------------------------------------------------------------------------------- */

enum { N_INT, N_FLT, N_VAR, N_BIN, N_UN, N_TERN, N_CALL, N_IDX, N_MEM, N_CAST, N_VEC, N_ASG, N_INC, N_RVAR };
enum { S_BLOCK, S_DECL, S_FOR, S_IF, S_EXPR, S_NOP };

typedef struct bentry bentry;
typedef struct bnode bnode;
struct bnode {
    unsigned char kind;
    int op;  /* N_BIN, N_UN, N_ASG, N_INC: index into ops */
    int sym; /* N_VAR, N_CALL: the name; N_CAST, N_VEC: the type */
    int line;
    int64_t i;
    double f, fhi; /* N_FLT: the values it can have (fnone: unknown) */
    int fnone;
    signed char ty; /* the type the analysis tells it has: 0 not yet known, else CT_I, CT_U or CT_X */
    bnode *a, *b, *c; /* bin a b; un a; tern a ? b : c; idx a[b]; mem a; cast a; asg a = b; inc a (op ++ or --) */
    bnode **args;
    int nargs;
    bentry *ent; /* N_RVAR: the variable a resolved expression names */
};

typedef struct bstmt bstmt;
struct bstmt {
    unsigned char kind;
    int line;
    bstmt **items; /* block */
    int nitems;
    int type, scalar, name, is_const; /* decl */
    bnode *init, *e;                  /* decl init; expr; if cond; for cond */
    bstmt *first, *then_s, *else_s;   /* for init, body; if branches */
    int loop_var;                     /* for: the canonical loop's variable, or -1 */
    bnode *step;
};

typedef struct {
    tnr_bparam pub;
    int sym;
} bparam;

typedef struct {
    int name, has_reqd;
    int64_t reqd[3];
    int nparams;
    tnr_bparam *params;
    int *param_syms;
    bstmt *body;
    unsigned char *assigned; /* per symbol */
} bkernel;

struct tnr_bsrc {
    barena ar;
    bsyms syms;
    bkernel *kernels;
    int nkernels;
    unsigned char *samplers; /* per symbol: 1 clamps out-of-range coordinates, 2 declared otherwise */
};

typedef struct {
    bctx *c;
    bsyms *syms;
    btok *t;
    int n, p, depth;
} bparser;

static btok *tk(bparser *ps, int k) { return &ps->t[ps->p + k < ps->n ? ps->p + k : ps->n - 1]; }
static int tk_op(bparser *ps, int k, const char *op) { return tk(ps, k)->kind == T_OP && !strcmp(ops[tk(ps, k)->v], op); }
static int tk_sym(bparser *ps, int k, int sym) { return tk(ps, k)->kind == T_ID && tk(ps, k)->v == sym; }
static int line_of(bparser *ps) { return tk(ps, 0)->line; }

static void tok_text(bparser *ps, const btok *t, char *buf, size_t n) {
    if (t->kind == T_END) snprintf(buf, n, "'%s'", "");
    else if (t->kind == T_ID) {
        char b[200];
        snprintf(buf, n, "'%s'", shown(ps->syms->names[t->v], b, sizeof b));
    } else if (t->kind == T_OP) snprintf(buf, n, "'%s'", ops[t->v]);
    else snprintf(buf, n, "'%.*s'", t->len > 40 ? 40 : t->len, t->s);
}

static void take_op(bparser *ps, const char *op) {
    char b[256];
    if (tk(ps, 0)->kind == T_END) bfail(ps->c, line_of(ps), "the source ends inside a kernel");
    if (!tk_op(ps, 0, op)) {
        tok_text(ps, tk(ps, 0), b, sizeof b);
        bfail(ps->c, line_of(ps), "'%s' expected, found %s", op, b);
    }
    ps->p++;
}

static btok *take(bparser *ps) {
    if (tk(ps, 0)->kind == T_END) bfail(ps->c, line_of(ps), "the source ends inside a kernel");
    return &ps->t[ps->p++];
}

static void enter(bparser *ps) {
    if (++ps->depth > MAX_DEPTH) bfail(ps->c, line_of(ps), "nesting deeper than %d", MAX_DEPTH);
}

static int type_ahead(bparser *ps, int k) {
    btok *t = tk(ps, k);
    return t->kind == T_ID && (ps->syms->flags[t->v] & SF_TYPEWORD);
}

/* (base type symbol, pointer depth), the words seen in *words (at most 32) */
static int parse_type(bparser *ps, int *stars, int *words, int *nwords) {
    int line = line_of(ps), base = -1, nbase = 0, i, has_unsigned = 0, has_signed = 0, bad = 0;
    *nwords = 0;
    *stars = 0;
    while (type_ahead(ps, 0)) {
        int w = take(ps)->v;
        if (*nwords < 32) words[(*nwords)++] = w;
        else bad = 1;
    }
    while (tk_op(ps, 0, "*")) {
        ps->p++;
        (*stars)++;
        while (tk_sym(ps, 0, K_CONST) || tk_sym(ps, 0, K_RESTRICT) || tk_sym(ps, 0, K_VOLATILE)) ps->p++;
    }
    for (i = 0; i < *nwords; i++) {
        int w = words[i];
        if (w == K_UNSIGNED) has_unsigned = 1;
        if (w == K_SIGNED) has_signed = 1;
        if (!(ps->syms->flags[w] & SF_QUALIFIER)) base = w, nbase++;
    }
    if (has_unsigned) {
        int kind = nbase ? base : K_INT;
        base = kind == K_CHAR ? K_UCHAR : kind == K_SHORT ? K_USHORT : kind == K_INT ? K_UINT : kind == K_LONG ? K_ULONG : -1;
        if (nbase > 1) base = -1;
        nbase = base >= 0;
    } else if (has_signed && !nbase) {
        base = K_INT;
        nbase = 1;
    }
    if (nbase != 1 || base < 0 || bad) {
        char b[256] = "";
        size_t used = 0;
        for (i = 0; i < *nwords && used < 200; i++)
            used += (size_t)snprintf(b + used, sizeof b - used, "%s%s", i ? " " : "", ps->syms->names[words[i]]);
        if (!*nwords) {
            btok *t = tk(ps, 0);
            if (t->kind == T_ID) snprintf(b, sizeof b, "%s", ps->syms->names[t->v]);
            else if (t->kind == T_OP) snprintf(b, sizeof b, "%s", ops[t->v]);
            else if (t->kind == T_NUM) snprintf(b, sizeof b, "%.*s", t->len > 40 ? 40 : t->len, t->s);
        }
        bfail(ps->c, line, "the type '%.200s'", b);
    }
    return base;
}

static bnode *new_node(bparser *ps, int kind, int line) {
    bnode *e = bmem(ps->c, sizeof *e);
    e->kind = (unsigned char)kind;
    e->line = line;
    return e;
}

static bnode *p_assign(bparser *ps);

static bnode *p_expr(bparser *ps) {
    bnode *e = p_assign(ps);
    if (tk_op(ps, 0, ",")) bfail(ps->c, line_of(ps), "the comma operator");
    return e;
}

static int prec_of(bparser *ps) {
    static const char *const levels[][4] = {{"||"}, {"&&"}, {"|"}, {"^"}, {"&"}, {"==", "!="}, {"<", "<=", ">", ">="},
                                            {"<<", ">>"}, {"+", "-"}, {"*", "/", "%"}};
    int l, k;
    if (tk(ps, 0)->kind != T_OP) return 0;
    for (l = 0; l < 10; l++)
        for (k = 0; k < 4 && levels[l][k]; k++)
            if (!strcmp(ops[tk(ps, 0)->v], levels[l][k])) return l + 1;
    return 0;
}

static bnode *p_unary(bparser *ps);

static bnode *p_binary(bparser *ps, int min_prec) {
    bnode *a = p_unary(ps);
    for (;;) {
        int prec = prec_of(ps), line;
        bnode *e;
        if (!prec || prec < min_prec) break;
        line = line_of(ps);
        e = new_node(ps, N_BIN, line);
        e->op = take(ps)->v;
        e->a = a;
        e->b = p_binary(ps, prec + 1);
        a = e;
    }
    return a;
}

static bnode *p_ternary(bparser *ps) {
    bnode *c = p_binary(ps, 1), *e;
    if (!tk_op(ps, 0, "?")) return c;
    take_op(ps, "?");
    e = new_node(ps, N_TERN, c->line);
    e->a = c;
    e->b = p_assign(ps);
    take_op(ps, ":");
    e->c = p_assign(ps);
    return e;
}

static int is_assign_op(int v) {
    static const char *const a[] = {"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "|=", "^="};
    return in_list(ops[v], a, sizeof a / sizeof *a);
}

static bnode *p_assign(bparser *ps) {
    int line;
    bnode *e;
    enter(ps);
    line = line_of(ps);
    e = p_ternary(ps);
    if (tk(ps, 0)->kind == T_OP && is_assign_op(tk(ps, 0)->v)) {
        bnode *x = new_node(ps, N_ASG, line);
        x->op = take(ps)->v;
        x->a = e;
        x->b = p_assign(ps);
        e = x;
    }
    ps->depth--;
    return e;
}

static bnode **p_list(bparser *ps, int *n) { /* assign (',' assign)* up to ')', consumed */
    bnode **items = NULL;
    int cap = 0;
    *n = 0;
    if (!tk_op(ps, 0, ")"))
        for (;;) {
            if (*n == cap) {
                bnode **m;
                cap = cap ? cap * 2 : 4;
                m = bmem(ps->c, (size_t)cap * sizeof *m);
                if (*n) memcpy(m, items, (size_t)*n * sizeof *m);
                items = m;
            }
            items[(*n)++] = p_assign(ps);
            if (!tk_op(ps, 0, ",")) break;
            take_op(ps, ",");
        }
    take_op(ps, ")");
    return items;
}

/* the values a float literal can have on the device (bounds.py _float_literal): 0 when unknown */
static int flt_literal(const char *text, int half, double *lo, double *hi) {
    double v = strtod(text, NULL), m, ulp, tiny = half ? ldexp(1.0, -14) : ldexp(1.0, -126);
    double top = half ? 65504.0 : 3.4028234663852886e38;
    int bits = half ? 11 : 24, ex;
    if (v == 0) return *lo = *hi = 0.0, 1;
    if (!(v <= top)) return 0;
    if (v < tiny) return *lo = 0.0, *hi = tiny, 1;
    m = frexp(v, &ex);
    if (ldexp(m, bits) == floor(ldexp(m, bits))) return *lo = *hi = v, 1;
    ulp = ldexp(1.0, ex - bits);
    *lo = v - ulp;
    *hi = v + ulp;
    return 1;
}

static bnode *p_postfix(bparser *ps) {
    int line = line_of(ps);
    btok *t = take(ps);
    bnode *e;
    char b[256];
    if (t->kind == T_NUM) {
        char text[64];
        int len = t->len, k = len, is_int = 1;
        if (len >= (int)sizeof text) bfail(ps->c, line, "the number '%.40s'", t->s);
        memcpy(text, t->s, (size_t)len);
        text[len] = 0;
        /* ^(0[xX][0-9A-Fa-f]+|[0-9]+)[uUlL]*$ */
        while (k > 0 && strchr("uUlL", text[k - 1])) k--;
        if (k > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
            int j;
            for (j = 2; j < k; j++) is_int &= is_hex(text[j]);
        } else {
            int j;
            for (j = 0; j < k; j++) is_int &= is_digit(text[j]);
            is_int &= k > 0;
        }
        if (is_int) {
            text[k] = 0;
            if (k > 1 && text[0] == '0' && text[1] != 'x' && text[1] != 'X')
                bfail(ps->c, line, "the octal number '%.*s'", len > 40 ? 40 : len, t->s);
            if (k > 12 || strtoull(text, NULL, 0) > (1ULL << 31))
                bfail(ps->c, line, "the integer '%.*s', out of the int range", len > 40 ? 40 : len, t->s);
            e = new_node(ps, N_INT, line);
            e->i = (int64_t)strtoull(text, NULL, 0);
            if (k < len) { /* 1u is (uint)1, 1l (long)1, 1ul (ulong)1 */
                int j, u = 0, l = 0;
                bnode *x = new_node(ps, N_CAST, line);
                for (j = k; j < len; j++) u |= t->s[j] == 'u' || t->s[j] == 'U', l |= t->s[j] == 'l' || t->s[j] == 'L';
                x->sym = u && l ? K_ULONG : u ? K_UINT : K_LONG;
                x->a = e;
                e = x;
            }
        } else {
            /* ^([0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)[fFhH]?$ */
            int j = 0, ok = 1, digits = 0, half;
            k = len;
            if (k > 0 && strchr("fFhH", text[k - 1])) k--;
            half = k < len && (text[k] == 'h' || text[k] == 'H');
            if (j < k && is_digit(text[j])) {
                while (j < k && is_digit(text[j])) j++;
                if (j < k && text[j] == '.') j++;
                while (j < k && is_digit(text[j])) j++;
            } else if (j < k && text[j] == '.') {
                j++;
                while (j < k && is_digit(text[j])) j++, digits++;
                ok = digits > 0;
            } else ok = 0;
            if (ok && j < k && (text[j] == 'e' || text[j] == 'E')) {
                int d = 0;
                j++;
                if (j < k && (text[j] == '+' || text[j] == '-')) j++;
                while (j < k && is_digit(text[j])) j++, d++;
                ok = d > 0;
            }
            if (!ok || j != k) bfail(ps->c, line, "the number '%.40s'", text);
            text[k] = 0;
            e = new_node(ps, N_FLT, line);
            e->fnone = !flt_literal(text, half, &e->f, &e->fhi);
        }
    } else if (t->kind == T_ID) {
        if (tk_op(ps, 0, "(")) {
            take_op(ps, "(");
            e = new_node(ps, N_CALL, line);
            e->sym = t->v;
            e->args = p_list(ps, &e->nargs);
        } else {
            e = new_node(ps, N_VAR, line);
            e->sym = t->v;
        }
    } else if (t->kind == T_OP && !strcmp(ops[t->v], "(")) {
        e = p_expr(ps);
        take_op(ps, ")");
    } else {
        tok_text(ps, t, b, sizeof b);
        bfail(ps->c, line, "%s where an expression belongs", b);
    }
    for (;;) {
        if (tk_op(ps, 0, "[")) {
            bnode *x = new_node(ps, N_IDX, line_of(ps));
            take_op(ps, "[");
            x->a = e;
            x->b = p_expr(ps);
            take_op(ps, "]");
            e = x;
        } else if (tk_op(ps, 0, ".")) {
            bnode *x;
            take_op(ps, ".");
            if (tk(ps, 0)->kind != T_ID) bfail(ps->c, line_of(ps), "a member name expected after '.'");
            take(ps);
            x = new_node(ps, N_MEM, e->line);
            x->a = e;
            e = x;
        } else if (tk_op(ps, 0, "++") || tk_op(ps, 0, "--")) {
            bnode *x = new_node(ps, N_INC, line_of(ps));
            x->op = take(ps)->v;
            x->a = e;
            e = x;
        } else if (tk_op(ps, 0, "->")) {
            bfail(ps->c, line_of(ps), "the operator '->'");
        } else {
            return e;
        }
    }
}

static bnode *p_unary(bparser *ps) {
    int line = line_of(ps);
    btok *t = tk(ps, 0);
    bnode *e;
    enter(ps);
    if (t->kind == T_OP && (tk_op(ps, 0, "-") || tk_op(ps, 0, "+") || tk_op(ps, 0, "!") || tk_op(ps, 0, "~"))) {
        e = new_node(ps, N_UN, line);
        e->op = take(ps)->v;
        e->a = p_unary(ps);
    } else if (tk_op(ps, 0, "++") || tk_op(ps, 0, "--")) {
        int op = take(ps)->v;
        e = new_node(ps, N_INC, line);
        e->op = op;
        e->a = p_unary(ps);
    } else if (tk_op(ps, 0, "*") || tk_op(ps, 0, "&")) {
        bfail(ps->c, line, "the pointer operator '%s'", ops[t->v]);
    } else if (tk_sym(ps, 0, K_SIZEOF)) {
        bfail(ps->c, line, "sizeof");
    } else if (tk_op(ps, 0, "(") && type_ahead(ps, 1)) {
        int stars, words[32], nwords, base;
        take_op(ps, "(");
        base = parse_type(ps, &stars, words, &nwords);
        take_op(ps, ")");
        if (stars) bfail(ps->c, line, "a cast to a pointer");
        if (tk_op(ps, 0, "(") && !(ps->syms->flags[base] & (SF_INT | SF_FLOAT))) {
            take_op(ps, "(");
            e = new_node(ps, N_VEC, line);
            e->sym = base;
            e->args = p_list(ps, &e->nargs);
            if (!e->nargs) bfail(ps->c, line_of(ps), "')' where an expression belongs");
        } else {
            e = new_node(ps, N_CAST, line);
            e->sym = base;
            e->a = p_unary(ps);
        }
    } else {
        e = p_postfix(ps);
    }
    ps->depth--;
    return e;
}

static bstmt *new_stmt(bparser *ps, int kind, int line) {
    bstmt *s = bmem(ps->c, sizeof *s);
    s->kind = (unsigned char)kind;
    s->line = line;
    s->loop_var = -1;
    return s;
}

static bstmt *p_statement(bparser *ps);

static bstmt *p_declaration(bparser *ps) {
    int line = line_of(ps), stars, words[32], nwords, i, array = 0, base;
    bstmt *s = new_stmt(ps, S_DECL, line);
    base = parse_type(ps, &stars, words, &nwords);
    if (stars) bfail(ps->c, line, "a pointer variable");
    if (tk(ps, 0)->kind != T_ID || (ps->syms->flags[tk(ps, 0)->v] & SF_TYPEWORD))
        bfail(ps->c, line_of(ps), "a variable name expected");
    s->type = base;
    s->name = take(ps)->v;
    while (tk_op(ps, 0, "[")) {
        take_op(ps, "[");
        p_expr(ps);
        take_op(ps, "]");
        array = 1;
    }
    if (tk_op(ps, 0, "=")) {
        take_op(ps, "=");
        if (tk_op(ps, 0, "{")) bfail(ps->c, line_of(ps), "an initializer list");
        s->init = p_assign(ps);
    }
    if (tk_op(ps, 0, ",")) bfail(ps->c, line_of(ps), "several variables in one declaration");
    s->scalar = !array && (ps->syms->flags[base] & (SF_INT | SF_FLOAT));
    for (i = 0; i < nwords; i++) s->is_const |= words[i] == K_CONST;
    return s;
}

static int is_var(const bnode *e, int sym) { return e && e->kind == N_VAR && e->sym == sym; }

static bstmt *p_for(bparser *ps) {
    int line = line_of(ps);
    bstmt *s = new_stmt(ps, S_FOR, line), *init = NULL;
    bnode *cond = NULL, *step = NULL;
    take(ps);
    take_op(ps, "(");
    if (!tk_op(ps, 0, ";")) {
        if (type_ahead(ps, 0)) init = p_declaration(ps);
        else {
            init = new_stmt(ps, S_EXPR, line_of(ps));
            init->e = p_expr(ps);
        }
    }
    take_op(ps, ";");
    if (!tk_op(ps, 0, ";")) cond = p_expr(ps);
    take_op(ps, ";");
    if (!tk_op(ps, 0, ")")) step = p_expr(ps);
    take_op(ps, ")");
    s->first = init;
    s->e = cond;
    s->step = step;
    s->then_s = p_statement(ps);
    /* the form the compiler writes: for (int v = A; v < B; ++v) (or v++, v += 1, v <= B) */
    if (init && init->kind == S_DECL && int_type_index(init->type) >= 0 && init->scalar && init->init) {
        int v = init->name;
        int step_ok = step && ((step->kind == N_INC && !strcmp(ops[step->op], "++") && is_var(step->a, v)) ||
                               (step->kind == N_ASG && !strcmp(ops[step->op], "+=") && is_var(step->a, v) &&
                                step->b->kind == N_INT && step->b->i == 1));
        int cond_ok = cond && cond->kind == N_BIN && (!strcmp(ops[cond->op], "<") || !strcmp(ops[cond->op], "<=")) &&
                      is_var(cond->a, v);
        if (step_ok && cond_ok) s->loop_var = v;
    }
    return s;
}

static bstmt *p_statement(bparser *ps) {
    int line = line_of(ps);
    btok *t = tk(ps, 0);
    bstmt *s;
    enter(ps);
    if (tk_op(ps, 0, "{")) {
        bstmt **items = NULL;
        int n = 0, cap = 0;
        take_op(ps, "{");
        while (!tk_op(ps, 0, "}")) {
            if (tk(ps, 0)->kind == T_END) bfail(ps->c, line_of(ps), "the source ends inside a kernel");
            if (n == cap) {
                bstmt **m;
                cap = cap ? cap * 2 : 8;
                m = bmem(ps->c, (size_t)cap * sizeof *m);
                if (n) memcpy(m, items, (size_t)n * sizeof *m);
                items = m;
            }
            items[n++] = p_statement(ps);
        }
        take_op(ps, "}");
        s = new_stmt(ps, S_BLOCK, line);
        s->items = items;
        s->nitems = n;
    } else if (tk_op(ps, 0, ";")) {
        take_op(ps, ";");
        s = new_stmt(ps, S_NOP, line);
    } else if (t->kind == T_ID && t->v == K_IF) {
        take(ps);
        take_op(ps, "(");
        s = new_stmt(ps, S_IF, line);
        s->e = p_expr(ps);
        take_op(ps, ")");
        s->then_s = p_statement(ps);
        if (tk_sym(ps, 0, K_ELSE)) {
            take(ps);
            s->else_s = p_statement(ps);
        }
    } else if (t->kind == T_ID && t->v == K_FOR) {
        s = p_for(ps);
    } else if (t->kind == T_ID && (t->v == K_RETURN || t->v == K_BREAK || t->v == K_CONTINUE)) {
        int w = take(ps)->v;
        if (!tk_op(ps, 0, ";")) bfail(ps->c, line, "%s with a value", keywords[w]);
        take_op(ps, ";");
        s = new_stmt(ps, S_NOP, line);
    } else if (t->kind == T_ID && (t->v == K_WHILE || t->v == K_DO || t->v == K_SWITCH || t->v == K_GOTO ||
                                   t->v == K_CASE || t->v == K_DEFAULT || t->v == K_TYPEDEF || t->v == K_STRUCT ||
                                   t->v == K_UNION || t->v == K_ENUM || t->v == K_ATTRIBUTE || t->v == K_ASM ||
                                   t->v == K_ELSE)) {
        bfail(ps->c, line, "the statement '%s'", keywords[t->v]);
    } else if (type_ahead(ps, 0)) {
        s = p_declaration(ps);
        take_op(ps, ";");
    } else {
        s = new_stmt(ps, S_EXPR, line);
        s->e = p_expr(ps);
        take_op(ps, ";");
    }
    ps->depth--;
    return s;
}

/* names assigned anywhere, but a canonical loop's variable in its own step */
static void assigned_expr(const bnode *e, unsigned char *out) {
    int k;
    if (!e) return;
    if (e->kind == N_ASG && e->a->kind == N_VAR) out[e->a->sym] = 1;
    if (e->kind == N_INC && e->a->kind == N_VAR) out[e->a->sym] = 1;
    assigned_expr(e->a, out);
    assigned_expr(e->b, out);
    assigned_expr(e->c, out);
    for (k = 0; k < e->nargs; k++) assigned_expr(e->args[k], out);
}

static void assigned_stmt(const bstmt *s, unsigned char *out) {
    int k;
    if (!s) return;
    switch (s->kind) {
    case S_BLOCK:
        for (k = 0; k < s->nitems; k++) assigned_stmt(s->items[k], out);
        break;
    case S_DECL: assigned_expr(s->init, out); break;
    case S_FOR:
        assigned_stmt(s->first, out);
        assigned_expr(s->e, out);
        if (s->loop_var < 0) assigned_expr(s->step, out);
        assigned_stmt(s->then_s, out);
        break;
    case S_IF:
        assigned_expr(s->e, out);
        assigned_stmt(s->then_s, out);
        assigned_stmt(s->else_s, out);
        break;
    case S_EXPR: assigned_expr(s->e, out); break;
    default: break;
    }
}

/* The height of a syntax tree (a node is 1 higher than its highest child), found without recursion. */
typedef struct {
    const void *node;
    int is_stmt, h;
} hitem;

static int tree_height(bctx *c, const bstmt *body) {
    hitem *stack = NULL;
    int n = 0, cap = 0, best = 0;
#define HPUSH(x, st, hh)                                                                                            \
    do {                                                                                                           \
        if (x) {                                                                                                   \
            if (n == cap) {                                                                                        \
                hitem *m_;                                                                                         \
                cap = cap ? cap * 2 : 256;                                                                         \
                m_ = bmem(c, (size_t)cap * sizeof *m_);                                                            \
                if (n) memcpy(m_, stack, (size_t)n * sizeof *m_);                                                  \
                stack = m_;                                                                                        \
            }                                                                                                      \
            stack[n].node = (x), stack[n].is_stmt = (st), stack[n].h = (hh), n++;                                 \
        }                                                                                                          \
    } while (0)
    HPUSH(body, 1, 1);
    while (n) {
        hitem it = stack[--n];
        int k;
        if (it.h > best) best = it.h;
        if (best > MAX_HEIGHT) break;
        if (it.is_stmt) {
            const bstmt *s = it.node;
            for (k = 0; k < s->nitems; k++) HPUSH(s->items[k], 1, it.h + 1);
            HPUSH(s->first, 1, it.h + 1);
            HPUSH(s->init, 0, it.h + 1);
            HPUSH(s->e, 0, it.h + 1);
            HPUSH(s->step, 0, it.h + 1);
            HPUSH(s->then_s, 1, it.h + 1);
            HPUSH(s->else_s, 1, it.h + 1);
        } else {
            const bnode *e = it.node;
            HPUSH(e->a, 0, it.h + 1);
            HPUSH(e->b, 0, it.h + 1);
            HPUSH(e->c, 0, it.h + 1);
            for (k = 0; k < e->nargs; k++) HPUSH(e->args[k], 0, it.h + 1);
        }
    }
#undef HPUSH
    return best;
}

/* ---- the source: kernels and samplers ----------------------------------------------------------------------- */

static int parse_int_literal(bparser *ps, const btok *t, int64_t *out) {
    char text[64];
    int k, j, ok = 1;
    if (t->kind != T_NUM || t->len >= (int)sizeof text) return 0;
    memcpy(text, t->s, (size_t)t->len);
    text[t->len] = 0;
    k = t->len;
    while (k > 0 && strchr("uUlL", text[k - 1])) k--;
    text[k] = 0;
    if (k > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X'))
        for (j = 2; j < k; j++) ok &= is_hex(text[j]);
    else {
        for (j = 0; j < k; j++) ok &= is_digit(text[j]);
        ok &= k > 0 && !(k > 1 && text[0] == '0'); /* no octal */
    }
    (void)ps;
    if (!ok || k > 12) return 0;
    *out = (int64_t)strtoull(text, NULL, 0);
    return 1;
}

static int is_pure_call(const char *name);
static int vfunc(const char *name, int *store, int64_t *n, int64_t *step);

/* whether the analysis gives name a meaning of its own (a function it models; bounds.py _modelled) */
static int modelled(const char *name) {
    static const char *const images[] = {"read_imagef", "read_imageh", "read_imagei", "read_imageui", "write_imagef",
                                         "write_imageh", "write_imagei", "write_imageui"};
    int store;
    int64_t n, step;
    return is_pure_call(name) || in_list(name, images, sizeof images / sizeof *images) || vfunc(name, &store, &n, &step);
}

/* the helpers tuner.codegen.opencl emits, byte for byte (bounds.py HELPERS) */
static const char *const helpers[] = {
    "inline int floordiv_i(int a, int b) { int q = a / b; return (q * b > a) ? q - 1 : q; }",
    "inline int floormod_i(int a, int b) { int r = a % b; return r < 0 ? r + b : r; }",
};
#define NHELPERS ((int)(sizeof helpers / sizeof *helpers))

static int parse_kernel(bctx *c, tnr_bsrc *src, btoks *ts, int p) {
    bparser ps;
    bkernel kern;
    int has_reqd = 0;
    int64_t reqd[3] = {0, 0, 0};
    btok *t = ts->t;
    memset(&kern, 0, sizeof kern);
    memset(&ps, 0, sizeof ps);
    ps.c = c;
    ps.syms = &src->syms;
    ps.t = t;
    ps.n = ts->n;
    while (t[p].kind == T_ID && t[p].v == K_ATTRIBUTE) {
        int q = p + 1, depth = 0, i, found = -1;
        for (;;) {
            if (t[q].kind == T_END) bfail(c, t[q].line, "an unterminated __attribute__");
            if (t[q].kind == T_OP && !strcmp(ops[t[q].v], "(")) depth++;
            if (t[q].kind == T_OP && !strcmp(ops[t[q].v], ")")) depth--;
            q++;
            if (depth == 0) break;
        }
        for (i = p + 1; i < q && found < 0; i++)
            if (t[i].kind == T_ID && t[i].v == K_REQD) found = i;
        if (found >= 0) {
            int i0 = found, ok = i0 + 7 < q;
            ok = ok && t[i0 + 1].kind == T_OP && !strcmp(ops[t[i0 + 1].v], "(") && t[i0 + 7].kind == T_OP &&
                 !strcmp(ops[t[i0 + 7].v], ")") && t[i0 + 3].kind == T_OP && !strcmp(ops[t[i0 + 3].v], ",") &&
                 t[i0 + 5].kind == T_OP && !strcmp(ops[t[i0 + 5].v], ",");
            ok = ok && parse_int_literal(&ps, &t[i0 + 2], &reqd[0]) && parse_int_literal(&ps, &t[i0 + 4], &reqd[1]) &&
                 parse_int_literal(&ps, &t[i0 + 6], &reqd[2]);
            if (!ok) bfail(c, t[p].line, "reqd_work_group_size of three integers expected");
            has_reqd = 1;
        }
        p = q;
    }
    if (!(t[p].kind == T_ID && t[p].v == K_VOID) || t[p + 1].kind != T_ID || !(t[p + 2].kind == T_OP && !strcmp(ops[t[p + 2].v], "(")))
        bfail(c, t[p].line, "__kernel void NAME( expected");
    kern.name = t[p + 1].v;
    if (modelled(src->syms.names[kern.name])) {
        char b[200];
        bfail(c, t[p].line, "a kernel named '%s'", shown(src->syms.names[kern.name], b, sizeof b));
    }
    kern.has_reqd = has_reqd;
    memcpy(kern.reqd, reqd, sizeof reqd);
    ps.p = p + 3;
    {
        int cap = 0;
        if (!tk_op(&ps, 0, ")"))
            for (;;) {
                int line = line_of(&ps), stars, words[32], nwords, base, i, name, write = 0, is_const = 0;
                char b[200];
                base = parse_type(&ps, &stars, words, &nwords);
                if (tk(&ps, 0)->kind != T_ID) bfail(c, line, "a parameter name expected");
                name = take(&ps)->v;
                for (i = 0; i < nwords; i++) {
                    if (words[i] == K_WRITE_ONLY_ || words[i] == K_WRITE_ONLY || words[i] == K_READ_WRITE_ ||
                        words[i] == K_READ_WRITE)
                        write = 1;
                    if (words[i] == K_CONST) is_const = 1;
                }
                if (kern.nparams == cap) {
                    tnr_bparam *m = bmem(c, (size_t)(cap ? cap * 2 : 8) * sizeof *m);
                    int *ms = bmem(c, (size_t)(cap ? cap * 2 : 8) * sizeof *ms);
                    if (kern.nparams) {
                        memcpy(m, kern.params, (size_t)kern.nparams * sizeof *m);
                        memcpy(ms, kern.param_syms, (size_t)kern.nparams * sizeof *ms);
                    }
                    kern.params = m;
                    kern.param_syms = ms;
                    cap = cap ? cap * 2 : 8;
                }
                {
                    tnr_bparam *pp = &kern.params[kern.nparams];
                    const char *bn = src->syms.names[base];
                    pp->name = src->syms.names[name];
                    if (base == K_IMAGE2D_T && !stars) {
                        pp->image = 1;
                        pp->write = write;
                    } else if (stars == 1 && (!strcmp(bn, "char") || !strcmp(bn, "uchar") || !strcmp(bn, "short") ||
                                              !strcmp(bn, "ushort") || !strcmp(bn, "int") || !strcmp(bn, "uint") ||
                                              !strcmp(bn, "long") || !strcmp(bn, "ulong") || !strcmp(bn, "float") ||
                                              !strcmp(bn, "half") || !strcmp(bn, "double"))) {
                        pp->type = bn;
                        pp->write = !is_const;
                        pp->elem_bytes = !strcmp(bn, "char") || !strcmp(bn, "uchar") ? 1
                                         : !strcmp(bn, "short") || !strcmp(bn, "ushort") || !strcmp(bn, "half") ? 2
                                         : !strcmp(bn, "long") || !strcmp(bn, "ulong") || !strcmp(bn, "double") ? 8
                                                                                                                  : 4;
                    } else {
                        bfail(c, line, "kernel parameter '%s' is neither a buffer nor an image2d_t",
                              shown(pp->name, b, sizeof b));
                    }
                    for (i = 0; i < kern.nparams; i++)
                        if (kern.param_syms[i] == name)
                            bfail(c, line, "kernel parameter '%s' named twice", shown(pp->name, b, sizeof b));
                    kern.param_syms[kern.nparams++] = name;
                }
                if (tk_op(&ps, 0, ")")) break;
                take_op(&ps, ",");
            }
    }
    take_op(&ps, ")");
    if (!tk_op(&ps, 0, "{")) {
        char b[200];
        bfail(c, line_of(&ps), "the body of kernel '%s' expected", shown(src->syms.names[kern.name], b, sizeof b));
    }
    kern.body = p_statement(&ps);
    if (tree_height(c, kern.body) > MAX_HEIGHT) {
        char b[200];
        bfail(c, t[p].line, "the body of kernel '%s' nests deeper than %d", shown(src->syms.names[kern.name], b, sizeof b),
              MAX_HEIGHT);
    }
    {
        int i;
        for (i = 0; i < src->nkernels; i++)
            if (src->kernels[i].name == kern.name) {
                char b[200];
                bfail(c, t[p].line, "kernel '%s' is defined twice", shown(src->syms.names[kern.name], b, sizeof b));
            }
    }
    kern.assigned = bmem(c, (size_t)src->syms.n + 1);
    assigned_stmt(kern.body, kern.assigned);
    {
        bkernel *m = bmem(c, (size_t)(src->nkernels + 1) * sizeof *m);
        if (src->nkernels) memcpy(m, src->kernels, (size_t)src->nkernels * sizeof *m);
        m[src->nkernels++] = kern;
        src->kernels = m;
    }
    return ps.p;
}

typedef struct {
    bctx c;
    tnr_bsrc *src;
    btoks ts, hts[NHELPERS]; /* the source's tokens, the helpers' */
    const char *text;
    size_t len;
} bparse;

static void parse_all(bparse *w) {
    bctx *c = &w->c;
    tnr_bsrc *src = w->src;
    btok *t;
    int i, p = 0;
    for (i = 0; i < K_COUNT; i++) intern(c, &src->syms, keywords[i], strlen(keywords[i]));
    tokenize(c, &src->syms, w->text, w->len, &w->ts);
    for (i = 0; i < NHELPERS; i++) tokenize(c, &src->syms, helpers[i], strlen(helpers[i]), &w->hts[i]);
    src->samplers = bmem(c, (size_t)src->syms.n + 1);
    t = w->ts.t;
    while (t[p].kind != T_END) {
        if (t[p].kind == T_ID && (t[p].v == K_KERNEL_ || t[p].v == K_KERNEL)) {
            p = parse_kernel(c, src, &w->ts, p + 1);
        } else if (t[p].kind == T_ID && (t[p].v == K_CONSTANT_ || t[p].v == K_CONSTANT) && t[p + 1].kind == T_ID &&
                   t[p + 1].v == K_SAMPLER_T && t[p + 2].kind == T_ID) {
            int q = p + 3, clamps = 0, wraps = 0;
            while (t[q].kind != T_END && !(t[q].kind == T_OP && !strcmp(ops[t[q].v], ";"))) {
                if (t[q].kind == T_ID && (t[q].v == K_CLAMP_ || t[q].v == K_CLAMP_EDGE)) clamps = 1;
                if (t[q].kind == T_ID && (t[q].v == K_REPEAT || t[q].v == K_MIRRORED || t[q].v == K_NONE)) wraps = 1;
                q++;
            }
            for (i = p; i < q; i++) /* (no helper is a sampler) */
                if (t[i].kind == T_ID && modelled(src->syms.names[t[i].v])) {
                    char b[200];
                    bfail(c, t[p].line, "a file-scope definition naming '%s' that is not the compiler's own helper",
                          shown(src->syms.names[t[i].v], b, sizeof b));
                }
            src->samplers[t[p + 2].v] = clamps && !wraps ? 1 : 2;
            p = t[q].kind == T_END ? q : q + 1;
        } else { /* a helper function or a declaration, skipped to its end (it sees no kernel parameter) */
            int depth = 0, start = p, named = -1, h, q;
            while (t[p].kind != T_END) {
                const char *x = t[p].kind == T_OP ? ops[t[p].v] : "";
                p++;
                if (!strcmp(x, "{") || !strcmp(x, "(") || !strcmp(x, "[")) depth++;
                else if (!strcmp(x, "}") || !strcmp(x, ")") || !strcmp(x, "]")) {
                    depth--;
                    if (depth == 0 && !strcmp(x, "}")) break;
                } else if (!strcmp(x, ";") && depth == 0)
                    break;
            }
            for (q = start; q < p && named < 0; q++)
                if (t[q].kind == T_ID && modelled(src->syms.names[t[q].v])) named = t[q].v;
            for (h = 0; h < NHELPERS && named >= 0; h++) { /* the compiler's own helper, token for token */
                const btok *y = w->hts[h].t;
                int same = w->hts[h].n - 8 == p - start;
                for (q = 0; q < p - start && same; q++) {
                    const btok *x = &t[start + q];
                    same = x->kind == y[q].kind && x->v == y[q].v && x->len == y[q].len &&
                           (x->kind != T_NUM || !memcmp(x->s, y[q].s, (size_t)x->len));
                }
                if (same) named = -1;
            }
            if (named >= 0) {
                char b[200];
                bfail(c, t[start].line, "a file-scope definition naming '%s' that is not the compiler's own helper",
                      shown(src->syms.names[named], b, sizeof b));
            }
        }
    }
}

static int parse_guarded(bparse *volatile w) {
    if (setjmp(w->c.jb)) return 1;
    parse_all(w);
    return 0;
}

int tnr_bounds_parse(const char *text, size_t len, tnr_bsrc **out, int *line, char *what, size_t whatlen) {
    bparse *w = calloc(1, sizeof *w);
    int rc = TNR_OK;
    *out = NULL;
    *line = 0;
    if (what && whatlen) what[0] = 0;
    if (!w || !(w->src = calloc(1, sizeof *w->src))) {
        free(w);
        return TNR_E_NOMEM;
    }
    w->c.ar = &w->src->ar;
    w->text = text;
    w->len = len;
    if (parse_guarded(w)) {
        rc = w->c.nomem ? TNR_E_NOMEM : TNR_E_ARTIFACT;
        *line = w->c.line;
        if (what && whatlen) snprintf(what, whatlen, "%s", w->c.what);
        tnr_bounds_free(w->src);
    } else {
        *out = w->src;
    }
    free(w->ts.t);
    {
        int h;
        for (h = 0; h < NHELPERS; h++) free(w->hts[h].t);
    }
    free(w);
    return rc;
}

void tnr_bounds_free(tnr_bsrc *s) {
    if (!s) return;
    free(s->syms.names);
    free(s->syms.flags);
    free(s->syms.table);
    arena_free(&s->ar);
    free(s);
}

static const bkernel *find_kernel(const tnr_bsrc *s, const char *name) {
    int i;
    for (i = 0; i < s->nkernels; i++)
        if (!strcmp(s->syms.names[s->kernels[i].name], name)) return &s->kernels[i];
    return NULL;
}

int tnr_bounds_kernel(const tnr_bsrc *s, const char *name, int *nparams, const tnr_bparam **params, int *has_reqd,
                      int64_t reqd[3]) {
    const bkernel *k = find_kernel(s, name);
    if (!k) return 0;
    *nparams = k->nparams;
    *params = k->params;
    *has_reqd = k->has_reqd;
    memcpy(reqd, k->reqd, sizeof k->reqd);
    return 1;
}

/* ---- values: an int interval within int32, a float interval, or unknown ----------------------------------- */

enum { VN, VI, VF };

typedef struct {
    int k;
    int64_t lo, hi;
    double flo, fhi;
} bval;

static bval vnone(void) {
    bval v;
    memset(&v, 0, sizeof v);
    return v;
}

static bval vint(int64_t lo, int64_t hi) { /* _int: an interval inside int32, else unknown */
    bval v = vnone();
    if (lo < I32MIN || hi > I32MAX) return v;
    v.k = VI;
    v.lo = lo;
    v.hi = hi;
    return v;
}

static bval vraw(int64_t lo, int64_t hi) {
    bval v = vnone();
    v.k = VI;
    v.lo = lo;
    v.hi = hi;
    return v;
}

static bval vflt(double lo, double hi) {
    bval v = vnone();
    v.k = VF;
    v.flo = lo;
    v.fhi = hi;
    return v;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t abs64(int64_t a) { return a < 0 ? -a : a; }
static int64_t floordiv64(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static int64_t tdiv64(int64_t a, int64_t b) { return a / b; } /* C truncates, as _tdiv */

static int opis(int op, const char *s) { return !strcmp(ops[op], s); }

static bval vbin(const char *op, bval a, bval b) {
    int64_t al, ah, bl, bh;
    if (!strcmp(op, "<") || !strcmp(op, "<=") || !strcmp(op, ">") || !strcmp(op, ">=") || !strcmp(op, "==") ||
        !strcmp(op, "!=") || !strcmp(op, "&&") || !strcmp(op, "||"))
        return vraw(0, 1);
    if (a.k != VI || b.k != VI) return vnone();
    al = a.lo, ah = a.hi, bl = b.lo, bh = b.hi;
    if (!strcmp(op, "+")) return vint(al + bl, ah + bh);
    if (!strcmp(op, "-")) return vint(al - bh, ah - bl);
    if (!strcmp(op, "*")) {
        int64_t c0 = al * bl, c1 = al * bh, c2 = ah * bl, c3 = ah * bh;
        return vint(min64(min64(c0, c1), min64(c2, c3)), max64(max64(c0, c1), max64(c2, c3)));
    }
    if (!strcmp(op, "/")) {
        int64_t c0, c1, c2, c3;
        if (bl <= 0 && 0 <= bh) return vnone();
        c0 = tdiv64(al, bl), c1 = tdiv64(al, bh), c2 = tdiv64(ah, bl), c3 = tdiv64(ah, bh);
        return vint(min64(min64(c0, c1), min64(c2, c3)), max64(max64(c0, c1), max64(c2, c3)));
    }
    if (!strcmp(op, "%")) {
        int64_t small, m;
        if (bl <= 0 && 0 <= bh) return vnone();
        small = min64(abs64(bl), abs64(bh));
        m = max64(abs64(bl), abs64(bh));
        if (al >= 0) {
            if (ah < small) return vraw(al, ah);
            if (bl == bh && al / m == ah / m) return vraw(al % m, ah % m);
            return vraw(0, min64(ah, m - 1));
        }
        if (ah <= 0) return vraw(max64(al, 1 - m), 0);
        return vraw(max64(al, 1 - m), min64(ah, m - 1));
    }
    if (!strcmp(op, "<<") || !strcmp(op, ">>")) {
        if (bl != bh || bl < 0 || bl > 31) return vnone();
        if (!strcmp(op, "<<")) return vint(al * ((int64_t)1 << bl), ah * ((int64_t)1 << bl));
        return vraw(floordiv64(al, (int64_t)1 << bl), floordiv64(ah, (int64_t)1 << bl));
    }
    if (!strcmp(op, "&")) {
        if (al >= 0 && bl >= 0) return vraw(0, min64(ah, bh));
        if (bl == bh && bl >= 0) return vraw(0, bl);
        if (al == ah && al >= 0) return vraw(0, al);
        return vnone();
    }
    if (!strcmp(op, "|") || !strcmp(op, "^")) {
        if (al >= 0 && bl >= 0) {
            int64_t x = max64(ah, bh);
            int bits = 0;
            while (x) bits++, x >>= 1;
            return vraw(0, ((int64_t)1 << bits) - 1);
        }
        return vnone();
    }
    return vnone();
}

static bval vunion(bval a, bval b) {
    if (a.k == VN || b.k == VN || a.k != b.k) return vnone();
    if (a.k == VI) return vraw(min64(a.lo, b.lo), max64(a.hi, b.hi));
    return vflt(a.flo < b.flo ? a.flo : b.flo, a.fhi > b.fhi ? a.fhi : b.fhi);
}

static bval vmeet(bval iv, int64_t lo, int64_t hi) {
    int64_t lo2;
    if (iv.k != VI) return vraw(lo, hi);
    lo2 = max64(lo, iv.lo);
    return vraw(lo2, max64(lo2, min64(hi, iv.hi)));
}

static bval vcast(bval v, int type) {
    int t = int_type_index(type);
    if (t >= 0) {
        if (type == K_BOOL) return vraw(0, 1);
        if (v.k == VF) {
            double lo = v.flo, hi = v.fhi;
            if (isfinite(lo) && isfinite(hi) && trunc(lo) >= (double)I32MIN && trunc(hi) <= (double)I32MAX)
                v = vraw((int64_t)trunc(lo), (int64_t)trunc(hi));
            else
                v = vnone();
        }
        if (v.k == VI) {
            if (int_types[t].has) return v.lo >= int_types[t].lo && v.hi <= int_types[t].hi ? v : vraw(int_types[t].lo, int_types[t].hi);
            return !int_types[t].is_unsigned || v.lo >= 0 ? v : vnone();
        }
        return int_types[t].has ? vraw(int_types[t].lo, int_types[t].hi) : vnone();
    }
    if (is_float_type(type)) {
        if (v.k == VI) v = v.lo >= -(1LL << 24) && v.hi <= (1LL << 24) ? vflt((double)v.lo, (double)v.hi) : vnone();
        if (v.k == VF && type == K_HALF) {
            int ok = isfinite(v.flo) && isfinite(v.fhi) && v.flo == trunc(v.flo) && v.fhi == trunc(v.fhi) &&
                     fabs(v.flo) <= 2048 && fabs(v.fhi) <= 2048;
            return ok ? v : vnone();
        }
        return v;
    }
    return vnone();
}

static bval vfloat_of(bval v) { return v.k == VF ? v : vflt(-INFINITY, INFINITY); }

/* ---- the analysis ------------------------------------------------------------------------------------------ */

/* the types an expression can have, as the analysis tells them apart (bounds.py _class): a signed int (or a narrower
 * type, promoted to int), an unsigned type of 32 bits or more, anything else (long, float, vectors, unknown) */
enum { CT_I = 1, CT_U, CT_X };

static int class_of(const char *base) {
    static const char *const is[] = {"char", "uchar", "short", "ushort", "int", "bool"};
    static const char *const us[] = {"uint", "ulong", "size_t", "uintptr_t"};
    if (!base) return CT_X;
    if (in_list(base, is, sizeof is / sizeof *is)) return CT_I;
    if (in_list(base, us, sizeof us / sizeof *us)) return CT_U;
    return CT_X;
}

static int combine(int x, int y) { /* C's usual conversions (bounds.py _combine) */
    if (x == y) return x;
    if ((x == CT_I && y == CT_U) || (x == CT_U && y == CT_I)) return CT_U;
    return CT_X;
}

static int in24(bval v) { return v.k == VI && v.lo >= -(1LL << 23) && v.hi <= (1LL << 23) - 1; }

struct bentry {
    int sym;
    int ty; /* the type its declaration gives it (class_of) */
    bval iv;
    int tag; /* a const int that is a work-item's position: 1 + 3 * kind + dimension (kind 0 get_global_id,
              * 1 get_group_id, 2 get_local_id); else 0 */
    bentry *prev;
};

typedef struct {
    void *key; /* an entry (is_entry) or a resolved expression */
    int is_entry;
    bnode *atom;
    int64_t coef;
} bterm;

typedef struct {
    int ok; /* 0: not linear (None) */
    bterm *t;
    int n;
    int64_t c;
} blin;

typedef struct {
    bnode *r;
    int64_t lo, hi;
    blin lin;
} bfact;

typedef struct {
    bentry *e; /* NULL: a fact to pop */
    bval old;
} bundo;

typedef struct {
    bctx *c;
    tnr_bsrc *src;
    const bkernel *k;
    int64_t glob[3], local[3];
    bentry **cur;   /* per symbol: the variable of that name in scope */
    int *param_of;  /* per symbol: the kernel parameter's index, or -1 */
    bentry **stack; /* declarations, innermost last */
    int nstack, capstack;
    bfact *facts;
    int nfacts, capfacts;
    bundo *undo;
    int nundo, capundo;
    tnr_brange *out;
    int depth, recording;
    int64_t mult; /* the times the loops around this point run their body (an upper bound; -1: unknown) */
} ban;

static void *grow(ban *a, void *p, int *cap, int need, size_t size) {
    void *m;
    int c;
    if (need <= *cap) return p;
    c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    m = bmem(a->c, (size_t)c * size);
    if (*cap) memcpy(m, p, (size_t)*cap * size);
    *cap = c;
    return m;
}

static const char *symname(ban *a, int sym) { return a->src->syms.names[sym]; }
static bentry *lookup(ban *a, int sym) { return a->cur[sym]; }

static void declare(ban *a, bentry *e) {
    a->stack = grow(a, a->stack, &a->capstack, a->nstack + 1, sizeof *a->stack);
    e->prev = a->cur[e->sym];
    a->cur[e->sym] = e;
    a->stack[a->nstack++] = e;
}

static void scope_pop(ban *a, int mark) {
    while (a->nstack > mark) {
        bentry *e = a->stack[--a->nstack];
        a->cur[e->sym] = e->prev;
    }
}

static int is_pure_call(const char *name) {
    static const char *const pure[] = {"get_global_id", "get_local_id", "get_group_id", "get_global_size",
                                       "get_local_size", "get_num_groups", "get_global_offset", "min", "max", "clamp",
                                       "abs", "mul24", "mad24", "floordiv_i", "floormod_i", "fmin", "fmax", "floor",
                                       "ceil", "trunc"};
    return in_list(name, pure, sizeof pure / sizeof *pure);
}

static int pure(ban *a, const bnode *e) {
    int k;
    switch (e->kind) {
    case N_INT:
    case N_FLT: return 1;
    case N_VAR: return lookup(a, e->sym) != NULL && !a->k->assigned[e->sym];
    case N_BIN: return pure(a, e->a) && pure(a, e->b);
    case N_UN:
    case N_CAST: return pure(a, e->a);
    case N_TERN: return pure(a, e->a) && pure(a, e->b) && pure(a, e->c);
    case N_CALL:
        if (!is_pure_call(symname(a, e->sym))) return 0;
        for (k = 0; k < e->nargs; k++)
            if (!pure(a, e->args[k])) return 0;
        return 1;
    default: return 0;
    }
}

static int is_cmp_or_logic(int op) {
    return opis(op, "<") || opis(op, "<=") || opis(op, ">") || opis(op, ">=") || opis(op, "==") || opis(op, "!=") ||
           opis(op, "&&") || opis(op, "||");
}

static int is_id_call(const char *name) {
    return !strcmp(name, "get_global_id") || !strcmp(name, "get_local_id") || !strcmp(name, "get_group_id") ||
           !strcmp(name, "get_global_size") || !strcmp(name, "get_local_size") || !strcmp(name, "get_num_groups") ||
           !strcmp(name, "get_global_offset");
}

static int ctype(ban *a, bnode *e);

static int ctype_inner(ban *a, bnode *e) {
    switch (e->kind) {
    case N_INT: return e->i <= I32MAX ? CT_I : CT_X;
    case N_VAR: {
        bentry *ent = lookup(a, e->sym);
        return ent ? ent->ty : CT_X;
    }
    case N_BIN:
        if (is_cmp_or_logic(e->op)) return CT_I;
        if (opis(e->op, "<<") || opis(e->op, ">>")) return ctype(a, e->a);
        return combine(ctype(a, e->a), ctype(a, e->b));
    case N_UN: return opis(e->op, "!") ? CT_I : ctype(a, e->a);
    case N_TERN: return combine(ctype(a, e->b), ctype(a, e->c));
    case N_CAST: return class_of(symname(a, e->sym));
    case N_CALL: {
        const char *name = symname(a, e->sym);
        int t, k;
        if (is_id_call(name) || !strcmp(name, "abs")) return CT_U;
        if (!strcmp(name, "floordiv_i") || !strcmp(name, "floormod_i")) return CT_I;
        if ((!strcmp(name, "min") || !strcmp(name, "max") || !strcmp(name, "clamp") || !strcmp(name, "mul24") ||
             !strcmp(name, "mad24")) && e->nargs) {
            t = ctype(a, e->args[0]);
            for (k = 1; k < e->nargs; k++) t = combine(t, ctype(a, e->args[k]));
            return t;
        }
        return CT_X;
    }
    case N_IDX:
        if (e->a->kind == N_VAR) {
            bentry *ent;
            int i = a->param_of[e->a->sym];
            if (i >= 0) return a->k->params[i].image ? CT_X : class_of(a->k->params[i].type);
            ent = lookup(a, e->a->sym);
            return ent ? ent->ty : CT_X;
        }
        return CT_X;
    default: return CT_X;
    }
}

/* the type of e (bounds.py _Analysis.ctype), found once: a node of the source tree is one place in one scope */
static int ctype(ban *a, bnode *e) {
    if (!e->ty) e->ty = (signed char)ctype_inner(a, e);
    return e->ty;
}

/* v, the value of e, or unknown where e is unsigned and v may be negative (it wraps) */
static bval signed_v(ban *a, bnode *e, bval v) {
    if (v.k == VI && v.lo < 0 && ctype(a, e) == CT_U) return vnone();
    return v;
}

static bnode *resolve(ban *a, bnode *e) {
    bnode *r;
    int k;
    if (e->kind == N_INT || e->kind == N_FLT) return e;
    r = bmem(a->c, sizeof *r);
    *r = *e;
    switch (e->kind) {
    case N_VAR:
        r->kind = N_RVAR;
        r->ent = lookup(a, e->sym);
        break;
    case N_BIN: r->a = resolve(a, e->a), r->b = resolve(a, e->b); break;
    case N_UN:
    case N_CAST: r->a = resolve(a, e->a); break;
    case N_TERN: r->a = resolve(a, e->a), r->b = resolve(a, e->b), r->c = resolve(a, e->c); break;
    case N_CALL:
        r->args = bmem(a->c, (size_t)(e->nargs ? e->nargs : 1) * sizeof *r->args);
        for (k = 0; k < e->nargs; k++) r->args[k] = resolve(a, e->args[k]);
        break;
    default: break;
    }
    return r;
}

/* whether e, as written here, is the resolved expression r */
static int same(ban *a, const bnode *e, const bnode *r) {
    int k;
    if (e->kind == N_VAR) return r->kind == N_RVAR && lookup(a, e->sym) == r->ent;
    if (e->kind != r->kind) return 0;
    switch (e->kind) {
    case N_BIN: return e->op == r->op && same(a, e->a, r->a) && same(a, e->b, r->b);
    case N_UN: return e->op == r->op && same(a, e->a, r->a);
    case N_CAST: return e->sym == r->sym && same(a, e->a, r->a);
    case N_TERN: return same(a, e->a, r->a) && same(a, e->b, r->b) && same(a, e->c, r->c);
    case N_CALL:
        if (e->sym != r->sym || e->nargs != r->nargs) return 0;
        for (k = 0; k < e->nargs; k++)
            if (!same(a, e->args[k], r->args[k])) return 0;
        return 1;
    case N_INT: return e->i == r->i;
    case N_FLT: return e->fnone == r->fnone && e->f == r->f && e->fhi == r->fhi;
    default: return 0;
    }
}

/* two resolved expressions alike (Python's == on the resolved tuples) */
static int rsame(const bnode *x, const bnode *y) {
    int k;
    if (x->kind != y->kind) return 0;
    switch (x->kind) {
    case N_RVAR: return x->ent == y->ent;
    case N_BIN: return x->op == y->op && rsame(x->a, y->a) && rsame(x->b, y->b);
    case N_UN: return x->op == y->op && rsame(x->a, y->a);
    case N_CAST: return x->sym == y->sym && rsame(x->a, y->a);
    case N_TERN: return rsame(x->a, y->a) && rsame(x->b, y->b) && rsame(x->c, y->c);
    case N_CALL:
        if (x->sym != y->sym || x->nargs != y->nargs) return 0;
        for (k = 0; k < x->nargs; k++)
            if (!rsame(x->args[k], y->args[k])) return 0;
        return 1;
    case N_INT: return x->i == y->i;
    case N_FLT: return x->fnone == y->fnone && x->f == y->f && x->fhi == y->fhi;
    default: return 0;
    }
}

static int keyeq(const bterm *x, const bterm *y) {
    if (x->is_entry != y->is_entry) return 0;
    return x->is_entry ? x->key == y->key : rsame(x->key, y->key);
}

static blin lin_none(void) {
    blin l;
    memset(&l, 0, sizeof l);
    return l;
}

static blin lin_terms(ban *a, int n) {
    blin l = lin_none();
    l.ok = 1;
    l.t = n ? bmem(a->c, (size_t)n * sizeof *l.t) : NULL;
    return l;
}

static blin linear(ban *a, bnode *e);

static blin atom(ban *a, bnode *e) {
    blin l;
    if (!pure(a, e)) return lin_none();
    l = lin_terms(a, 1);
    l.n = 1;
    l.t[0].atom = e;
    l.t[0].coef = 1;
    if (e->kind == N_VAR) {
        l.t[0].key = lookup(a, e->sym);
        l.t[0].is_entry = 1;
    } else {
        l.t[0].key = resolve(a, e);
    }
    return l;
}

static int mul_big(int64_t x, int64_t y, int64_t *out) { /* x * y, 0 when it passes BIG in magnitude */
    int64_t p;
    if (__builtin_mul_overflow(x, y, &p) || abs64(p) > BIG) return 0;
    *out = p;
    return 1;
}

static blin linear(ban *a, bnode *e) {
    if (e->kind == N_INT) {
        blin l = lin_none();
        if (e->i < I32MIN || e->i > I32MAX) return l;
        l.ok = 1;
        l.c = e->i;
        return l;
    }
    if (e->kind == N_UN && (opis(e->op, "-") || opis(e->op, "+"))) {
        blin sub = linear(a, e->a);
        int64_t s = opis(e->op, "-") ? -1 : 1;
        int k;
        if (!sub.ok) return sub;
        for (k = 0; k < sub.n; k++) sub.t[k].coef *= s;
        sub.c *= s;
        return sub;
    }
    if (e->kind == N_BIN && (opis(e->op, "+") || opis(e->op, "-"))) {
        blin x = linear(a, e->a), y, r;
        int64_t s = opis(e->op, "+") ? 1 : -1;
        int k, j, n;
        if (!x.ok) return x;
        y = linear(a, e->b);
        if (!y.ok) return y;
        r = lin_terms(a, x.n + y.n);
        memcpy(r.t, x.t, (size_t)x.n * sizeof *r.t);
        n = x.n;
        for (k = 0; k < y.n; k++) {
            for (j = 0; j < n; j++)
                if (keyeq(&r.t[j], &y.t[k])) break;
            if (j < n) r.t[j].coef += s * y.t[k].coef;
            else {
                r.t[n] = y.t[k];
                r.t[n++].coef = s * y.t[k].coef;
            }
        }
        r.c = x.c + s * y.c;
        for (k = 0, j = 0; k < n; k++)
            if (r.t[k].coef) r.t[j++] = r.t[k];
        r.n = j;
        if (abs64(r.c) > BIG) return lin_none();
        for (k = 0; k < r.n; k++)
            if (abs64(r.t[k].coef) > BIG) return lin_none();
        return r;
    }
    if (e->kind == N_BIN && opis(e->op, "*")) {
        blin x = linear(a, e->a), y, r;
        int64_t f, c;
        int k;
        if (!x.ok) return x;
        y = linear(a, e->b);
        if (!y.ok) return y;
        if (x.n && y.n) return atom(a, e);
        if (x.n) {
            blin t = x;
            x = y;
            y = t;
        }
        f = x.c;
        r = lin_terms(a, y.n);
        for (k = 0; k < y.n; k++) {
            int64_t p;
            if (!f) continue;
            if (!mul_big(f, y.t[k].coef, &p)) return lin_none();
            r.t[r.n] = y.t[k];
            r.t[r.n++].coef = p;
        }
        if (!mul_big(f, y.c, &c)) return lin_none();
        r.c = c;
        return r;
    }
    return atom(a, e);
}

static bval quiet(ban *a, bnode *e);
static bval eval(ban *a, bnode *e);
static bval value(ban *a, bnode *e);

static bval atom_value(ban *a, const bterm *t) { return t->is_entry ? ((bentry *)t->key)->iv : quiet(a, t->atom); }

/* the interval of c + the terms but skip; 0 when unknown or too large */
static int rest(ban *a, const bterm *t, int n, int64_t c, const void *skip, int64_t *rlo, int64_t *rhi) {
    int64_t lo = c, hi = c;
    int k;
    for (k = 0; k < n; k++) {
        bval v;
        int64_t p, q;
        if (skip && t[k].key == skip) continue;
        v = atom_value(a, &t[k]);
        if (v.k != VI) return 0;
        if (!mul_big(t[k].coef, v.lo, &p) || !mul_big(t[k].coef, v.hi, &q)) return 0;
        lo += min64(p, q);
        hi += max64(p, q);
        if (abs64(lo) > BIG || abs64(hi) > BIG) return 0;
    }
    *rlo = lo;
    *rhi = hi;
    return 1;
}

static void push_undo(ban *a, bentry *e, bval old) {
    a->undo = grow(a, a->undo, &a->capundo, a->nundo + 1, sizeof *a->undo);
    a->undo[a->nundo].e = e;
    a->undo[a->nundo].old = old;
    a->nundo++;
}

static void undo_to(ban *a, int mark) {
    while (a->nundo > mark) {
        bundo *u = &a->undo[--a->nundo];
        if (!u->e) a->nfacts--;
        else u->e->iv = u->old;
    }
}

static bval quiet_value(ban *a, bnode *e) {
    int saved = a->recording;
    bval v;
    a->recording = 0;
    v = value(a, e);
    a->recording = saved;
    return v;
}

static bval quiet(ban *a, bnode *e) {
    int saved = a->recording;
    bval v;
    a->recording = 0;
    v = eval(a, e);
    a->recording = saved;
    return v;
}

static int narrow(ban *a, bnode *e, int64_t lo, int64_t hi) {
    bval cur = quiet_value(a, e);
    blin lin;
    int k;
    if (cur.k == VI) lo = max64(lo, cur.lo), hi = min64(hi, cur.hi);
    if (lo > hi) return 0;
    if (!pure(a, e)) return 1;
    lin = cur.k == VI ? linear(a, e) : lin_none(); /* (a value that may wrap: its terms tell nothing) */
    a->facts = grow(a, a->facts, &a->capfacts, a->nfacts + 1, sizeof *a->facts);
    a->facts[a->nfacts].r = resolve(a, e);
    a->facts[a->nfacts].lo = lo;
    a->facts[a->nfacts].hi = hi;
    a->facts[a->nfacts].lin = lin;
    a->nfacts++;
    push_undo(a, NULL, vnone());
    if (!lin.ok) return 1;
    for (k = 0; k < lin.n; k++) {
        bentry *ent;
        int64_t rlo, rhi, x, y, vlo, vhi, coef = lin.t[k].coef;
        if (!lin.t[k].is_entry) continue;
        ent = lin.t[k].key;
        if (ent->iv.k != VI) continue;
        if (!rest(a, lin.t, lin.n, lin.c, ent, &rlo, &rhi)) continue;
        x = lo - rhi, y = hi - rlo; /* coef * v in [x, y] */
        if (coef > 0) vlo = -floordiv64(-x, coef), vhi = floordiv64(y, coef);
        else vlo = -floordiv64(-y, coef), vhi = floordiv64(x, coef);
        vlo = max64(vlo, ent->iv.lo);
        vhi = min64(vhi, ent->iv.hi);
        if (vlo > vhi) return 0;
        push_undo(a, ent, ent->iv);
        ent->iv = vraw(vlo, vhi);
    }
    return 1;
}

typedef struct {
    bnode *a, *b;
    const char *op;
} batom;

static const char *flip(const char *op) {
    return !strcmp(op, "<") ? ">=" : !strcmp(op, "<=") ? ">" : !strcmp(op, ">") ? "<=" : !strcmp(op, ">=") ? "<"
         : !strcmp(op, "==") ? "!=" : "==";
}

static int is_cmp(int op) {
    return opis(op, "<") || opis(op, "<=") || opis(op, ">") || opis(op, ">=") || opis(op, "==") || opis(op, "!=");
}

static void atoms(ban *a, bnode *c, int truth, batom **out, int *n, int *cap) {
    if (c->kind == N_BIN && opis(c->op, "&&") && truth) {
        atoms(a, c->a, 1, out, n, cap);
        atoms(a, c->b, 1, out, n, cap);
    } else if (c->kind == N_BIN && opis(c->op, "||") && !truth) {
        atoms(a, c->a, 0, out, n, cap);
        atoms(a, c->b, 0, out, n, cap);
    } else if (c->kind == N_UN && opis(c->op, "!")) {
        atoms(a, c->a, !truth, out, n, cap);
    } else if (c->kind == N_BIN && is_cmp(c->op)) {
        const char *op = truth ? ops[c->op] : flip(ops[c->op]);
        if (strcmp(op, "!=") != 0) {
            *out = grow(a, *out, cap, *n + 1, sizeof **out);
            (*out)[*n].a = c->a;
            (*out)[*n].b = c->b;
            (*out)[*n].op = op;
            (*n)++;
        }
    }
}

/* narrows by c being truth: the undo mark, or -1 when c cannot be truth here */
static int assume(ban *a, bnode *c, int truth) {
    int mark = a->nundo, n = 0, cap = 0, k;
    batom *at = NULL;
    atoms(a, c, truth, &at, &n, &cap);
    for (k = 0; k < n; k++) {
        bnode *x = at[k].a, *y = at[k].b;
        const char *op = at[k].op;
        bval ia = quiet_value(a, x), ib = quiet_value(a, y);
        int64_t gap;
        int tx, ty;
        if (ia.k == VF || ib.k == VF) continue;
        tx = ctype(a, x), ty = ctype(a, y);
        if ((tx != CT_I && tx != CT_U) || (ty != CT_I && ty != CT_U)) continue; /* (long, unknown types) */
        if ((tx == CT_U || ty == CT_U) && !(ia.k == VI && ib.k == VI && ia.lo >= 0 && ib.lo >= 0))
            continue; /* an unsigned comparison: the same as the signed one only of values proven non-negative */
        if (!strcmp(op, ">") || !strcmp(op, ">=")) {
            bnode *t = x;
            bval tv = ia;
            x = y, y = t, ia = ib, ib = tv;
            op = !strcmp(op, ">") ? "<" : "<=";
        }
        gap = !strcmp(op, "<") ? 1 : 0;
        if (!strcmp(op, "==")) {
            if (ib.k == VI && !narrow(a, x, ib.lo, ib.hi)) goto dead;
            if (ia.k == VI && !narrow(a, y, ia.lo, ia.hi)) goto dead;
        } else {
            if (ib.k == VI && !narrow(a, x, I32MIN, ib.hi - gap)) goto dead;
            if (ia.k == VI && !narrow(a, y, ia.lo + gap, I32MAX)) goto dead;
        }
    }
    return mark;
dead:
    undo_to(a, mark);
    return -1;
}

static bval value_inner(ban *a, bnode *e);

static bval value(ban *a, bnode *e) { return signed_v(a, e, value_inner(a, e)); }

static bval value_inner(ban *a, bnode *e) {
    bval v = eval(a, e);
    blin lin;
    bterm *terms;
    int n, k, f, applied = 0;
    int64_t lo, hi, rlo, rhi;
    if (!a->nfacts || v.k == VF) return v;
    if (!pure(a, e)) return v;
    lin = linear(a, e);
    if (!lin.ok) return v;
    n = lin.n;
    terms = bmem(a->c, (size_t)(n ? n : 1) * sizeof *terms);
    if (n) memcpy(terms, lin.t, (size_t)n * sizeof *terms);
    lo = hi = lin.c;
    for (f = a->nfacts - 1; f >= 0; f--) { /* the latest fact on an expression is the tightest */
        const bfact *fa = &a->facts[f];
        int64_t mine0 = 0, alpha, p, q;
        int j, found = 0, match = 1;
        if (!fa->lin.ok || !fa->lin.n || !n) continue;
        for (j = 0; j < n; j++)
            if (keyeq(&terms[j], &fa->lin.t[0])) found = 1, mine0 = terms[j].coef;
        if (!found || mine0 % fa->lin.t[0].coef) continue;
        alpha = mine0 / fa->lin.t[0].coef;
        for (k = 0; k < fa->lin.n && match; k++) {
            int64_t want;
            int has = 0;
            for (j = 0; j < n; j++)
                if (keyeq(&terms[j], &fa->lin.t[k])) has = 1, mine0 = terms[j].coef;
            if (!has || __builtin_mul_overflow(alpha, fa->lin.t[k].coef, &want) || want != mine0) match = 0;
        }
        if (!match) continue;
        for (j = 0, k = 0; j < n; j++) {
            int drop = 0, m;
            for (m = 0; m < fa->lin.n && !drop; m++) drop = keyeq(&terms[j], &fa->lin.t[m]);
            if (!drop) terms[k++] = terms[j];
        }
        n = k;
        applied = 1;
        if (!mul_big(alpha, fa->lo - fa->lin.c, &p) || !mul_big(alpha, fa->hi - fa->lin.c, &q)) return v;
        lo += min64(p, q);
        hi += max64(p, q);
        if (abs64(lo) > BIG || abs64(hi) > BIG) return v;
    }
    if (!applied) return v;
    if (!rest(a, terms, n, 0, NULL, &rlo, &rhi)) return v;
    lo += rlo;
    hi += rhi;
    if (lo < I32MIN || hi > I32MAX) return v;
    return v.k == VI ? vmeet(v, lo, hi) : vraw(lo, hi);
}

static bval known(ban *a, const bnode *e, bval v) {
    int k;
    for (k = 0; k < a->nfacts; k++)
        if (same(a, e, a->facts[k].r)) v = vmeet(v, a->facts[k].lo, a->facts[k].hi);
    return v;
}

/* ---- how much a launch can write (Source.analyse_writes) ---- */

/* the position a resolved expression is (an entry's tag, or get_*_id of a constant dimension, cast to int or not) */
static int node_tag(ban *a, const bnode *r) {
    if (r->kind == N_RVAR) return r->ent ? r->ent->tag : 0;
    if (r->kind == N_CAST && r->sym == K_INT) return node_tag(a, r->a);
    if (r->kind == N_CALL && r->nargs == 1 && r->args[0]->kind == N_INT && r->args[0]->i >= 0 && r->args[0]->i <= 2) {
        const char *name = symname(a, r->sym);
        int kind = !strcmp(name, "get_global_id") ? 0
                 : !strcmp(name, "get_group_id")  ? 1
                 : !strcmp(name, "get_local_id")  ? 2
                                                  : -1;
        if (kind >= 0) return 1 + 3 * kind + (int)r->args[0]->i;
    }
    return 0;
}

static int term_tag(ban *a, const bterm *t) {
    return t->is_entry ? ((const bentry *)t->key)->tag : node_tag(a, t->key);
}

/* the position two terms c1 * t1 + c2 * t2 are, up to the factor *c: get_global_id(d) of get_group_id(d) *
 * local size + get_local_id(d) (in either order), else 0 */
static int global_of(ban *a, const bterm *x, const bterm *y, int64_t *c) {
    int t1 = term_tag(a, x), t2 = term_tag(a, y);
    int64_t c1 = x->coef, c2 = y->coef, want;
    if (t1 && (t1 - 1) / 3 == 2) {
        int t = t1;
        int64_t cc = c1;
        t1 = t2, t2 = t, c1 = c2, c2 = cc;
    }
    *c = c2;
    if (!t1 || !t2 || (t1 - 1) / 3 != 1 || t2 != t1 + 3) return 0;
    if (__builtin_mul_overflow(c2, a->local[(t1 - 1) % 3], &want) || want != c1) return 0;
    return 1 + (t1 - 1) % 3;
}

/* the position a linear form is: a term alone (coefficient 1), or get_global_id(d) (global_of, factor 1); 0 */
static int position(ban *a, const blin *l) {
    int64_t c;
    int t;
    if (!l->ok || l->c != 0) return 0;
    if (l->n == 1 && l->t[0].coef == 1) return term_tag(a, &l->t[0]);
    if (l->n != 2) return 0;
    t = global_of(a, &l->t[0], &l->t[1], &c);
    return c == 1 ? t : 0;
}

/* an upper bound on the work-items that run this point of the code: per dimension, the launch's, or fewer where
 * a position in scope, or a fact in force on one, is narrowed; their product (-1: past BIG) */
static int64_t reach(ban *a) {
    int64_t total = 1;
    int d, k;
    for (d = 0; d < 3; d++) {
        int64_t g = a->glob[d], l = a->local[d], n[3], m;
        n[0] = g, n[1] = g / l, n[2] = l;
        if (g <= I32MAX) { /* (a position of a larger launch wraps in an int: no narrowing) */
            for (k = 0; k < a->nstack; k++) {
                const bentry *e = a->stack[k];
                if (e->tag && (e->tag - 1) % 3 == d && e->iv.k == VI)
                    n[(e->tag - 1) / 3] = min64(n[(e->tag - 1) / 3], e->iv.hi - e->iv.lo + 1);
            }
            for (k = 0; k < a->nfacts; k++) {
                const bfact *f = &a->facts[k];
                int64_t c;
                int t;
                if (!f->lin.ok || f->lin.n < 1 || f->lin.n > 2) continue;
                if (f->lin.n == 1) t = term_tag(a, &f->lin.t[0]), c = f->lin.t[0].coef;
                else t = global_of(a, &f->lin.t[0], &f->lin.t[1], &c);
                if (t && (t - 1) % 3 == d) /* c * position in [lo - const, hi - const] */
                    n[(t - 1) / 3] = min64(n[(t - 1) / 3], (f->hi - f->lo) / abs64(c) + 1);
            }
        }
        m = min64(n[0], n[1] * n[2]);
        if (m && total > BIG / m) return -1;
        total *= m;
    }
    return total;
}

/* a store of width elements (pixels) through parameter i here, inside span of them (BIG + 1: more): at most
 * reach() x the loops' runs x width more written, and at most span distinct */
static void count(ban *a, int i, int64_t width, int64_t span) {
    tnr_brange *o = &a->out[i];
    int64_t n = reach(a), f[2];
    int k;
    f[0] = a->mult, f[1] = width;
    for (k = 0; k < 2; k++) {
        if (n < 0 || f[k] < 0) {
            n = -1;
            break;
        }
        n = n > BIG / f[k] ? -1 : n * f[k];
    }
    if (n < 0 || span < n) n = span;
    o->writes = o->writes < 0 || n > BIG || o->writes + n > BIG ? -1 : o->writes + n;
}

static void access_buf(ban *a, int i, bnode *index, int64_t step, bnode *base, int line, int64_t width, int write);
static bval call(ban *a, bnode *e);

static bval eval_inner(ban *a, bnode *e) {
    char b[200];
    switch (e->kind) {
    case N_INT: return vint(e->i, e->i);
    case N_FLT: return e->fnone ? vnone() : vflt(e->f, e->fhi);
    case N_VAR: {
        bentry *ent;
        if (a->param_of[e->sym] >= 0)
            bfail(a->c, e->line, "parameter '%s' is used other than indexed, loaded, stored or passed to an image function",
                  shown(symname(a, e->sym), b, sizeof b));
        ent = lookup(a, e->sym);
        return ent ? ent->iv : vnone();
    }
    case N_BIN: {
        bnode **chain, *node = e;
        int n = 0, k;
        bval v;
        if (opis(e->op, "&&") || opis(e->op, "||")) {
            int mark;
            eval(a, e->a);
            mark = assume(a, e->a, opis(e->op, "&&"));
            if (mark >= 0) {
                eval(a, e->b);
                undo_to(a, mark);
            }
            return vraw(0, 1);
        }
        while (node->kind == N_BIN && !opis(node->op, "&&") && !opis(node->op, "||")) n++, node = node->a;
        chain = bmem(a->c, (size_t)n * sizeof *chain);
        for (node = e, k = 0; k < n; k++, node = node->a) chain[k] = node;
        v = eval(a, node);
        for (k = n - 1; k >= 0; k--) {
            bval w = eval(a, chain[k]->b);
            if (!is_cmp_or_logic(chain[k]->op) && ((v.k == VI && v.lo < 0) || (w.k == VI && w.lo < 0)) &&
                ctype(a, chain[k]) == CT_U)
                v = vnone(); /* a negative operand converted to an unsigned type */
            else
                v = vbin(ops[chain[k]->op], v, w);
            if (a->nfacts && chain[k] != e) v = known(a, chain[k], v);
            v = signed_v(a, chain[k], v);
        }
        return v;
    }
    case N_UN: {
        bval x = eval(a, e->a);
        if (opis(e->op, "!")) return vraw(0, 1);
        if (x.k == VN || opis(e->op, "+")) return x;
        if (x.k == VF) return opis(e->op, "-") ? vflt(-x.fhi, -x.flo) : vnone();
        return opis(e->op, "-") ? vint(-x.hi, -x.lo) : vint(-x.hi - 1, -x.lo - 1);
    }
    case N_TERN: {
        bval out = vnone();
        int live = 0, t;
        eval(a, e->a);
        for (t = 1; t >= 0; t--) {
            int mark = assume(a, e->a, t);
            bval v;
            if (mark < 0) continue;
            v = eval(a, t ? e->b : e->c);
            undo_to(a, mark);
            out = live ? vunion(out, v) : v;
            live = 1;
        }
        return out;
    }
    case N_CAST: return vcast(eval(a, e->a), e->sym);
    case N_VEC: {
        int k;
        for (k = 0; k < e->nargs; k++) eval(a, e->args[k]);
        return vnone();
    }
    case N_MEM: eval(a, e->a); return vnone();
    case N_IDX:
        if (e->a->kind == N_VAR && a->param_of[e->a->sym] >= 0) {
            access_buf(a, a->param_of[e->a->sym], e->b, 1, NULL, e->line, 1, 0);
        } else {
            eval(a, e->a);
            eval(a, e->b);
        }
        return vnone();
    case N_ASG: {
        bnode *lhs = e->a;
        if (lhs->kind == N_IDX && lhs->a->kind == N_VAR && a->param_of[lhs->a->sym] >= 0)
            access_buf(a, a->param_of[lhs->a->sym], lhs->b, 1, NULL, lhs->line, 1, 1);
        else if (lhs->kind == N_VAR) {
            if (a->param_of[lhs->sym] >= 0)
                bfail(a->c, e->line, "parameter '%s' is assigned", shown(symname(a, lhs->sym), b, sizeof b));
        } else
            eval(a, lhs);
        eval(a, e->b);
        return vnone();
    }
    case N_INC:
        if (e->a->kind == N_VAR) {
            if (a->param_of[e->a->sym] >= 0)
                bfail(a->c, e->line, "parameter '%s' is incremented", shown(symname(a, e->a->sym), b, sizeof b));
        } else if (e->a->kind == N_IDX && e->a->a->kind == N_VAR && a->param_of[e->a->a->sym] >= 0) {
            access_buf(a, a->param_of[e->a->a->sym], e->a->b, 1, NULL, e->a->line, 1, 1);
        } else
            eval(a, e->a);
        return vnone();
    case N_CALL: return call(a, e);
    default: bfail(a->c, 0, "the expression %d", e->kind);
    }
}

static bval eval(ban *a, bnode *e) {
    bval v;
    if (++a->depth > MAX_HEIGHT) bfail(a->c, 0, "an expression nested too deeply");
    v = eval_inner(a, e);
    a->depth--;
    if (a->nfacts && (e->kind == N_VAR || e->kind == N_BIN || e->kind == N_UN || e->kind == N_CAST ||
                      e->kind == N_CALL || e->kind == N_TERN))
        v = known(a, e, v);
    return signed_v(a, e, v);
}

/* vloadN / vstoreN / vload(a)_half(N) / vstore(a)_half(N)(_rtX): 1 and its store flag, width and step */
static int vfunc(const char *name, int *store, int64_t *n, int64_t *step) {
    static const char *const halves[] = {"vloada_half", "vload_half", "vstorea_half", "vstore_half"};
    static const char *const widths[] = {"16", "2", "3", "4", "8"};
    size_t k, w;
    for (k = 0; k < 4; k++) {
        size_t m = strlen(halves[k]);
        const char *p = name + m;
        int64_t width = 1;
        if (strncmp(name, halves[k], m) != 0) continue;
        for (w = 0; w < 5; w++)
            if (!strncmp(p, widths[w], strlen(widths[w]))) {
                width = atoi(widths[w]);
                p += strlen(widths[w]);
                break;
            }
        if (*p && strcmp(p, "_rte") && strcmp(p, "_rtz") && strcmp(p, "_rtp") && strcmp(p, "_rtn")) continue;
        *store = k >= 2;
        *n = width;
        *step = width == 3 && (k == 0 || k == 2) ? 4 : width;
        return 1;
    }
    for (k = 0; k < 2; k++) {
        const char *pre = k ? "vstore" : "vload";
        size_t m = strlen(pre);
        if (strncmp(name, pre, m) != 0) continue;
        for (w = 0; w < 5; w++)
            if (!strcmp(name + m, widths[w])) {
                *store = (int)k;
                *n = atoi(widths[w]);
                *step = *n;
                return 1;
            }
    }
    return 0;
}

static int is_param_var(ban *a, const bnode *e) { return e->kind == N_VAR && a->param_of[e->sym] >= 0; }

static bval image(ban *a, bnode *e, int write) {
    const char *name = symname(a, e->sym);
    bnode *rest[4], *coord;
    int nrest = 0, k, i, clamped = 0;
    bval x, y;
    char b[200];
    if (!e->nargs || !is_param_var(a, e->args[0]))
        bfail(a->c, e->line, "%s of an image other than a kernel parameter", name);
    i = a->param_of[e->args[0]->sym];
    if (!a->k->params[i].image)
        bfail(a->c, e->line, "%s of the buffer parameter '%s'", name, shown(symname(a, e->args[0]->sym), b, sizeof b));
    for (k = 1; k < e->nargs && nrest < 4; k++) rest[nrest++] = e->args[k];
    if (e->nargs - 1 > 4) nrest = 5; /* too many: refused below */
    if (!write && nrest == 2) {
        bnode *s = rest[0];
        clamped = s->kind == N_VAR && a->src->samplers[s->sym] == 1 && lookup(a, s->sym) == NULL;
        rest[0] = rest[1];
        nrest = 1;
    }
    if (nrest != (write ? 2 : 1)) bfail(a->c, e->line, "%s with %d arguments", name, e->nargs);
    coord = rest[0];
    for (k = 1; k < nrest; k++) eval(a, rest[k]);
    if (coord->kind == N_VEC && coord->nargs == 2) {
        x = value(a, coord->args[0]);
        y = value(a, coord->args[1]);
    } else {
        x = y = value(a, coord);
    }
    if (clamped || !a->recording) return vnone();
    if (x.k != VI || y.k != VI)
        bfail(a->c, e->line, "cannot bound the pixel %s addresses in image '%s'", name,
              shown(symname(a, e->args[0]->sym), b, sizeof b));
    {
        tnr_brange *o = &a->out[i];
        if (!o->has_pixels) {
            o->has_pixels = 1;
            o->xlo = x.lo, o->xhi = x.hi, o->ylo = y.lo, o->yhi = y.hi;
        } else {
            o->xlo = min64(o->xlo, x.lo), o->xhi = max64(o->xhi, x.hi);
            o->ylo = min64(o->ylo, y.lo), o->yhi = max64(o->yhi, y.hi);
        }
    }
    if (write) {
        int64_t span;
        if (__builtin_mul_overflow(x.hi - x.lo + 1, y.hi - y.lo + 1, &span) || span > BIG) span = BIG + 1;
        count(a, i, 1, span);
    }
    return vnone();
}

static bval call(ban *a, bnode *e) {
    const char *name = symname(a, e->sym);
    int store, k, nv = e->nargs;
    int64_t n, step;
    bval vs[8];
    char b[200];
    if (vfunc(name, &store, &n, &step)) {
        bnode *ptr, *base = NULL;
        if (e->nargs != (store ? 3 : 2)) bfail(a->c, e->line, "%s with %d arguments", name, e->nargs);
        if (store) eval(a, e->args[0]);
        ptr = e->args[e->nargs - 1];
        if (ptr->kind == N_BIN && opis(ptr->op, "+") && is_param_var(a, ptr->a)) base = ptr->b, ptr = ptr->a;
        else if (ptr->kind == N_BIN && opis(ptr->op, "+") && is_param_var(a, ptr->b)) base = ptr->a, ptr = ptr->b;
        if (!is_param_var(a, ptr)) bfail(a->c, e->line, "%s of a pointer other than a kernel parameter", name);
        access_buf(a, a->param_of[ptr->sym], e->args[e->nargs - 2], step, base, e->line, n, store);
        return vnone();
    }
    if (!strcmp(name, "atomic_inc")) { /* atomic_inc(P + i): element i of an int buffer parameter, read and written */
        bnode *ptr = e->nargs == 1 ? e->args[0] : NULL;
        int i;
        if (e->nargs != 1) bfail(a->c, e->line, "%s with %d arguments", name, e->nargs);
        if (!(ptr->kind == N_BIN && opis(ptr->op, "+") && is_param_var(a, ptr->a)) ||
            a->k->params[i = a->param_of[ptr->a->sym]].image || !a->k->params[i].type ||
            strcmp(a->k->params[i].type, "int") != 0)
            bfail(a->c, e->line, "%s of a pointer other than an int buffer parameter plus an index", name);
        access_buf(a, i, ptr->b, 1, NULL, e->line, 1, 1);
        return vnone();
    }
    if (!strcmp(name, "read_imagef") || !strcmp(name, "read_imageh") || !strcmp(name, "read_imagei") ||
        !strcmp(name, "read_imageui"))
        return image(a, e, 0);
    if (!strcmp(name, "write_imagef") || !strcmp(name, "write_imageh") || !strcmp(name, "write_imagei") ||
        !strcmp(name, "write_imageui"))
        return image(a, e, 1);
    for (k = 0; k < e->nargs; k++)
        if (is_param_var(a, e->args[k]))
            bfail(a->c, e->line, "parameter '%s' is passed to %s()", shown(symname(a, e->args[k]->sym), b, sizeof b),
                  name);
    for (k = 0; k < e->nargs; k++) {
        bval v = eval(a, e->args[k]);
        if (k < 8) vs[k] = v;
    }
    if (!strncmp(name, "get_", 4) && (!strcmp(name, "get_global_id") || !strcmp(name, "get_local_id") ||
                                      !strcmp(name, "get_group_id") || !strcmp(name, "get_global_size") ||
                                      !strcmp(name, "get_local_size") || !strcmp(name, "get_num_groups") ||
                                      !strcmp(name, "get_global_offset"))) {
        int64_t g, l;
        int d;
        if (nv != 1 || vs[0].k != VI || vs[0].lo != vs[0].hi || vs[0].lo < 0 || vs[0].lo > 2)
            bfail(a->c, e->line, "%s of a dimension other than 0, 1 or 2", name);
        d = (int)vs[0].lo;
        g = a->glob[d], l = a->local[d];
        if (!strcmp(name, "get_global_id")) return vraw(0, g - 1);
        if (!strcmp(name, "get_local_id")) return vraw(0, l - 1);
        if (!strcmp(name, "get_group_id")) return vraw(0, g / l - 1);
        if (!strcmp(name, "get_global_size")) return vraw(g, g);
        if (!strcmp(name, "get_local_size")) return vraw(l, l);
        if (!strcmp(name, "get_num_groups")) return vraw(g / l, g / l);
        return vraw(0, 0);
    }
    if ((!strcmp(name, "min") || !strcmp(name, "max") || !strcmp(name, "clamp") || !strcmp(name, "mul24") ||
         !strcmp(name, "mad24")) && ctype(a, e) == CT_U) {
        for (k = 0; k < nv && k < 8; k++)
            if (vs[k].k == VI && vs[k].lo < 0) return vnone(); /* a negative argument converted to an unsigned type */
    }
    if ((!strcmp(name, "min") || !strcmp(name, "max") || !strcmp(name, "fmin") || !strcmp(name, "fmax")) && nv == 2) {
        bval x = vs[0], y = vs[1];
        int is_min = !strcmp(name, "min") || !strcmp(name, "fmin");
        if (name[0] == 'f' || x.k == VF || y.k == VF) {
            if (x.k == VI || y.k == VI) return vnone();
            x = vfloat_of(x), y = vfloat_of(y);
            if (is_min) return vflt(x.flo < y.flo ? x.flo : y.flo, x.fhi < y.fhi ? x.fhi : y.fhi);
            return vflt(x.flo > y.flo ? x.flo : y.flo, x.fhi > y.fhi ? x.fhi : y.fhi);
        }
        for (k = 0; k < 2; k++)
            if (vs[k].k == VN && ctype(a, e->args[k]) != CT_I) return vnone(); /* wider than int, or unsigned */
        if (x.k == VN) x = vraw(I32MIN, I32MAX);
        if (y.k == VN) y = vraw(I32MIN, I32MAX);
        if (is_min) return vraw(min64(x.lo, y.lo), min64(x.hi, y.hi));
        return vraw(max64(x.lo, y.lo), max64(x.hi, y.hi));
    }
    if (!strcmp(name, "clamp") && nv == 3) {
        bval x = vs[0], lo = vs[1], hi = vs[2];
        if (x.k == VF || lo.k == VF || hi.k == VF) return vnone();
        for (k = 0; k < 3; k++)
            if (vs[k].k == VN && ctype(a, e->args[k]) != CT_I) return vnone();
        if (x.k == VN) x = vraw(I32MIN, I32MAX);
        if (lo.k == VN) lo = vraw(I32MIN, I32MAX);
        if (hi.k == VN) hi = vraw(I32MIN, I32MAX);
        if (lo.hi > hi.lo) return vnone(); /* (clamp of a lower bound above the upper one is undefined) */
        return vraw(min64(max64(x.lo, lo.lo), hi.lo), min64(max64(x.hi, lo.hi), hi.hi));
    }
    if (!strcmp(name, "abs") && nv == 1 && vs[0].k == VI) {
        bval x = vs[0];
        return vint(x.lo <= 0 && 0 <= x.hi ? 0 : min64(abs64(x.lo), abs64(x.hi)), max64(abs64(x.lo), abs64(x.hi)));
    }
    if ((!strcmp(name, "floor") || !strcmp(name, "ceil") || !strcmp(name, "trunc")) && nv == 1 && vs[0].k == VF) {
        bval x = vs[0];
        if (!isfinite(x.flo) || !isfinite(x.fhi)) return vflt(-INFINITY, INFINITY);
        if (!strcmp(name, "floor")) return vflt(floor(x.flo), floor(x.fhi));
        if (!strcmp(name, "ceil")) return vflt(ceil(x.flo), ceil(x.fhi));
        return vflt(trunc(x.flo), trunc(x.fhi));
    }
    /* (past 24-bit operands: implementation-defined) */
    if (!strcmp(name, "mul24") && nv == 2) return in24(vs[0]) && in24(vs[1]) ? vbin("*", vs[0], vs[1]) : vnone();
    if (!strcmp(name, "mad24") && nv == 3)
        return in24(vs[0]) && in24(vs[1]) ? vbin("+", vbin("*", vs[0], vs[1]), vs[2]) : vnone();
    if (!strcmp(name, "floordiv_i") && nv == 2 && vs[0].k == VI && vs[1].k == VI) {
        bval x = vs[0], y = vs[1];
        int64_t c0, c1, c2, c3;
        if (y.lo <= 0) return vnone(); /* (the helper floors for a positive divisor only) */
        c0 = floordiv64(x.lo, y.lo), c1 = floordiv64(x.lo, y.hi), c2 = floordiv64(x.hi, y.lo), c3 = floordiv64(x.hi, y.hi);
        return vint(min64(min64(c0, c1), min64(c2, c3)), max64(max64(c0, c1), max64(c2, c3)));
    }
    if (!strcmp(name, "floormod_i") && nv == 2 && vs[0].k == VI && vs[1].k == VI) {
        bval x = vs[0], y = vs[1];
        if (y.lo <= 0) return vnone();
        return x.lo >= 0 && x.hi < y.lo ? x : vraw(0, y.hi - 1);
    }
    return vnone();
}

static void access_buf(ban *a, int i, bnode *index, int64_t step, bnode *base, int line, int64_t width, int write) {
    bval v, bv;
    char b[200];
    int64_t lo, hi;
    tnr_brange *o = &a->out[i];
    if (a->k->params[i].image)
        bfail(a->c, line, "the image parameter '%s' is indexed as a buffer", shown(a->k->params[i].name, b, sizeof b));
    v = value(a, index);
    bv = base ? value(a, base) : vraw(0, 0);
    if (!a->recording) return;
    if (v.k != VI || bv.k != VI)
        bfail(a->c, line, "cannot bound the index of parameter '%s'", shown(a->k->params[i].name, b, sizeof b));
    lo = step * v.lo + bv.lo;
    hi = step * v.hi + bv.hi + width - 1;
    if (!o->has_range) {
        o->has_range = 1;
        o->lo = lo, o->hi = hi;
    } else {
        o->lo = min64(o->lo, lo), o->hi = max64(o->hi, hi);
    }
    if (write) count(a, i, width, hi - lo + 1);
}

static void run(ban *a, bstmt *s);

static void loop(ban *a, bstmt *s) {
    int mark = a->nstack, inner;
    int64_t saved = a->mult, trips = -1;
    if (s->first) run(a, s->first);
    if (s->loop_var >= 0) {
        bentry *ent = lookup(a, s->loop_var);
        bval bound = value(a, s->e->b);
        if (ent->iv.k != VI || bound.k != VI) {
            ent->iv = vnone();
        } else {
            int64_t last = bound.hi - (opis(s->e->op, "<") ? 1 : 0);
            if (last < ent->iv.lo) { /* the body never runs */
                scope_pop(a, mark);
                return;
            }
            ent->iv = vraw(ent->iv.lo, last);
            trips = last - ent->iv.lo + 1;
        }
    } else {
        if (s->first && s->first->kind == S_DECL) lookup(a, s->first->name)->iv = vnone();
        if (s->e) eval(a, s->e);
    }
    if (s->step) eval(a, s->step);
    /* the body runs at most once per value of its variable (of a loop the compiler writes) */
    a->mult = saved < 0 || trips < 0 || saved > BIG / trips ? -1 : saved * trips;
    inner = a->nstack;
    run(a, s->then_s);
    scope_pop(a, inner);
    scope_pop(a, mark);
    a->mult = saved;
}

static void run(ban *a, bstmt *s) {
    int k, mark = a->nstack;
    char b[200];
    switch (s->kind) {
    case S_BLOCK:
        for (k = 0; k < s->nitems; k++) run(a, s->items[k]);
        scope_pop(a, mark);
        break;
    case S_EXPR: eval(a, s->e); break;
    case S_DECL: {
        bentry *ent;
        bval v = vnone();
        if (a->param_of[s->name] >= 0)
            bfail(a->c, s->line, "a variable shadows parameter '%s'", shown(symname(a, s->name), b, sizeof b));
        if (s->init) v = value(a, s->init);
        if (s->scalar && s->init && (s->is_const || !a->k->assigned[s->name])) v = vcast(v, s->type);
        else v = vnone();
        ent = bmem(a->c, sizeof *ent);
        ent->sym = s->name;
        ent->ty = class_of(symname(a, s->type));
        ent->iv = v;
        ent->tag = 0;
        if (s->type == K_INT && v.k == VI && pure(a, s->init)) { /* (read before the variable is in scope) */
            blin l = linear(a, s->init);
            ent->tag = position(a, &l);
        }
        declare(a, ent);
        break;
    }
    case S_IF: {
        int t;
        eval(a, s->e);
        for (t = 1; t >= 0; t--) {
            bstmt *branch = t ? s->then_s : s->else_s;
            int m, inner;
            if (!branch) continue;
            m = assume(a, s->e, t);
            if (m < 0) continue; /* this branch never runs with this launch */
            inner = a->nstack;
            run(a, branch);
            scope_pop(a, inner);
            undo_to(a, m);
        }
        break;
    }
    case S_FOR: loop(a, s); break;
    default: break;
    }
}

/* run() under setjmp: 0, or 1 when the analysis failed (c says why) */
static int run_guarded(ban *volatile a) {
    if (setjmp(a->c->jb)) return 1;
    run(a, a->k->body);
    return 0;
}

int tnr_bounds_analyse(tnr_bsrc *s, const char *name, const int64_t global[3], const int64_t local[3],
                       tnr_brange *out, int *line, char *what, size_t whatlen) {
    const bkernel *k = find_kernel(s, name);
    barena ar = {NULL};
    bctx *c;
    ban *a;
    int i, rc = TNR_OK;
    *line = 0;
    if (what && whatlen) what[0] = 0;
    if (!k) {
        if (what && whatlen) snprintf(what, whatlen, "no kernel '%.80s' is defined", name);
        return TNR_E_ARTIFACT;
    }
    memset(out, 0, (size_t)(k->nparams ? k->nparams : 1) * sizeof *out);
    c = calloc(1, sizeof *c);
    a = calloc(1, sizeof *a);
    if (!c || !a) {
        free(c);
        free(a);
        return TNR_E_NOMEM;
    }
    c->ar = &ar;
    a->c = c;
    a->src = s;
    a->k = k;
    memcpy(a->glob, global, sizeof a->glob);
    memcpy(a->local, local, sizeof a->local);
    a->cur = arena_get(&ar, (size_t)(s->syms.n + 1) * sizeof *a->cur);
    a->param_of = arena_get(&ar, (size_t)(s->syms.n + 1) * sizeof *a->param_of);
    if (!a->cur || !a->param_of) {
        rc = TNR_E_NOMEM;
    } else {
        memset(a->cur, 0, (size_t)(s->syms.n + 1) * sizeof *a->cur);
        for (i = 0; i <= s->syms.n; i++) a->param_of[i] = -1;
        for (i = 0; i < k->nparams; i++) a->param_of[k->param_syms[i]] = i;
        a->out = out;
        a->recording = 1;
        a->mult = 1;
        if (run_guarded(a)) {
            rc = c->nomem ? TNR_E_NOMEM : TNR_E_ARTIFACT;
            *line = c->line;
            if (what && whatlen) snprintf(what, whatlen, "%s", c->what);
        }
    }
    arena_free(&ar);
    free(c);
    free(a);
    return rc;
}
