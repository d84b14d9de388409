/* A small strict JSON (RFC 8259) DOM parser: UTF-8 checked, no comments, no trailing commas, no NaN, no
 * duplicate keys, a depth limit, a size limit; numbers remember whether they were written as integers. All
 * nodes live in one arena freed by tnr_json_free. */
#ifndef TNR_JSON_H
#define TNR_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { TJ_NULL, TJ_BOOL, TJ_NUMBER, TJ_STRING, TJ_ARRAY, TJ_OBJECT } tj_type;

typedef struct tj_value tj_value;
struct tj_value {
    tj_type type;
    int is_int;       /* a number written without fraction or exponent that fits int64 */
    int64_t i;        /* its value when is_int */
    double d;         /* numbers: the value; bools: 0 or 1 */
    const char *s;    /* strings: NUL-terminated UTF-8 (len bytes; may hold \u0000 only if allowed) */
    size_t len;       /* strings: bytes; arrays and objects: members */
    tj_value **items; /* arrays: values; objects: values, in file order */
    const char **keys; /* objects: keys, in file order */
};

typedef struct tj_doc tj_doc;

#define TJ_MAX_DEPTH 64

/* Parses text[len]. On failure returns NULL and writes "line L column C: what" into err (errlen bytes). */
tj_doc *tnr_json_parse(const char *text, size_t len, size_t max_len, char *err, size_t errlen);
tj_value *tnr_json_root(tj_doc *doc);
void tnr_json_free(tj_doc *doc);

/* Object member by key (NULL when absent or v is not an object). */
tj_value *tnr_json_get(const tj_value *v, const char *key);
const char *tnr_json_type_name(tj_type t);

#endif
