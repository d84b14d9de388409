/* Shared helpers of the native runtime: error codes and formatted error messages. */
#ifndef TNR_COMMON_H
#define TNR_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "../include/tuner_runtime.h"

#define TNR_ERRLEN 2048

/* Writes a message into err (TNR_ERRLEN bytes) and returns code. */
int tnr_fail(char *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Prepends "prefix: " to the message already in err. */
void tnr_prefix(char *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Reads a whole file once: opened non-blocking, checked on the descriptor to be a regular file of at most max bytes
 * before a byte is read (a FIFO, a device or a larger file is an error naming what it is). *data is NUL-terminated,
 * caller frees. */
int tnr_read_file(const char *path, size_t max, unsigned char **data, size_t *len, char *err);

/* Reads the size bytes of an open regular file from fd into a malloc'd, NUL-terminated *data, and closes fd. 0 when
 * all were read; -1 out of memory; otherwise the errno of a failed read, or -2 when the file shrank while read. */
int tnr_read_fd(int fd, size_t size, unsigned char **data);

/* One line on stderr, "who[pid]: message\n", written in one write(2) (best effort: a log never fails its caller). */
void tnr_log_line(const char *who, const char *fmt, va_list ap);

/* What a non-regular file is, in words ("a FIFO (named pipe)", "a character device", ...), from st_mode. */
const char *tnr_file_kind(unsigned mode);

/* Joins dir and name with '/', into a malloc'd string (NULL when out of memory). */
char *tnr_join(const char *dir, const char *name);

/* At most max bytes of s[0..len) into buf (n bytes, NUL-terminated) for a terminal: control characters (C0, DEL,
 * and C1 as UTF-8 encodes them) as \xNN; "..." when cut. Returns buf. */
const char *tnr_printable(const char *s, size_t len, size_t max, char *buf, size_t n);

/* mkdir -p: path and the folders above it that are missing, new ones with mode (before the umask); 0 or -1 (errno
 * set, ENAMETOOLONG for a path of 4096 bytes or more). */
int tnr_mkdirs(const char *path, unsigned mode);

/* a * b, saturating at UINT64_MAX. */
uint64_t tnr_mul_sat(uint64_t a, uint64_t b);

/* Whether p[n] is text: UTF-8, no NUL (what the Python side decodes as UTF-8). */
int tnr_is_text(const unsigned char *p, size_t n);
/* a, b and c joined with NUL bytes between them (as Python's "\0".join) into buf; the length written. */
size_t tnr_join3(char *buf, size_t cap, const char *a, const char *b, const char *c);

#endif
