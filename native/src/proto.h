/* The agent protocol's frames and bodies (docs/agent-protocol.md): a 24-byte little-endian header, then a
 * body of u32 / u64 / f64 / str / bytes fields. Readers check every length against what is left; writers grow
 * a buffer. No allocation is sized by a peer's number before that number is checked. */
#ifndef TNR_PROTO_H
#define TNR_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define TPR_MAGIC "TNR1"
#define TPR_VERSION 1
#define TPR_HEADER 24
#define TPR_MAX_BODY ((uint64_t)1 << 30)
#define TPR_MAX_STR ((uint32_t)16 << 20)

enum { TPR_HELLO = 1, TPR_OPEN, TPR_BUILD, TPR_ALLOC, TPR_WRITE, TPR_READ, TPR_FREE, TPR_KERNEL, TPR_RUN, TPR_RESET,
       TPR_PING, TPR_BYE, TPR_SENSORS, TPR_CHALLENGE, TPR_LAST = TPR_CHALLENGE };
/* CHALLENGE (issue 54): the host's nonce in, the agent's nonce and proof out; HELLO then carries
 * "hmac-sha256:" and the host's proof in hex instead of the token. Nonces of TPR_NONCE bytes. */
#define TPR_NONCE 32
#define TPR_HMAC_PREFIX "hmac-sha256:"
#define TPR_AGENT_LABEL "tuner-agent v1 agent"
#define TPR_HOST_LABEL "tuner-agent v1 host"
enum { TPR_OK = 0, TPR_BAD_REQUEST, TPR_COMPILE, TPR_RUNTIME, TPR_TIMEOUT, TPR_CRASHED, TPR_NO_DEVICE, TPR_AUTH };
enum { TPR_RUN_ONCE = 0, TPR_RUN_PROFILE = 1, TPR_RUN_TIME = 2 };
enum { TPR_BUILD_KEEP = 1 }; /* BUILD flags: keep the program's binary in the cache */
enum { TPR_SENSOR_CLOCK = 1, TPR_SENSOR_TEMP = 2 }; /* SENSORS reply flags: which values were read */

typedef struct {
    char magic[4];
    uint16_t version, type;
    uint32_t rid, word; /* word: deadline in ms (requests) or status (replies) */
    uint64_t len;
} tpr_header;

const char *tpr_type_name(unsigned type);
const char *tpr_status_name(unsigned status);

void tpr_pack_header(unsigned char out[TPR_HEADER], unsigned type, uint32_t rid, uint32_t word, uint64_t len);
void tpr_unpack_header(const unsigned char in[TPR_HEADER], tpr_header *h);
/* NULL when the header is acceptable, else why not (another magic, another version, a body too long). */
const char *tpr_header_problem(const tpr_header *h);

/* Whole reads and writes on a file descriptor, retried on EINTR. read: 0 done, 1 end of stream before any
 * byte, -1 error or end of stream inside. write: 0 or -1. */
int tpr_read_full(int fd, void *buf, size_t n);
int tpr_write_full(int fd, const void *buf, size_t n);

/* A body, read field by field. Any read past the end sets bad (and why) and returns 0 / NULL. */
typedef struct {
    const unsigned char *p;
    size_t n, i;
    int bad;
    char why[160];
} tpr_reader;

void tpr_reader_init(tpr_reader *r, const unsigned char *p, size_t n);
uint32_t tpr_u32(tpr_reader *r);
uint64_t tpr_u64(tpr_reader *r);
double tpr_f64(tpr_reader *r);
/* A str field as a NUL-terminated malloc'd copy; text only (UTF-8 without NUL), else bad. *len may be NULL. */
char *tpr_str(tpr_reader *r, size_t *len);
/* A bytes field: a pointer into the body. */
const unsigned char *tpr_bytes(tpr_reader *r, uint64_t *len);
/* 1 when the body was read exactly (nothing bad, nothing left over); else sets why. */
int tpr_end(tpr_reader *r);

/* A growing body. oom is set (and further puts ignored) when memory runs out. */
typedef struct {
    unsigned char *p;
    size_t n, cap;
    int oom;
} tpr_buf;

void tpr_put_raw(tpr_buf *b, const void *data, size_t n);
void tpr_put_u32(tpr_buf *b, uint32_t v);
void tpr_put_u64(tpr_buf *b, uint64_t v);
void tpr_put_f64(tpr_buf *b, double v);
/* A str field: text only (an invalid byte is written '?', a NUL ' '), cut at 16 MiB. */
void tpr_put_str(tpr_buf *b, const char *s, size_t n);
void tpr_put_cstr(tpr_buf *b, const char *s);
void tpr_put_bytes(tpr_buf *b, const void *data, uint64_t n);
/* n more bytes at the end, to be filled by the caller (NULL when out of memory). */
unsigned char *tpr_reserve(tpr_buf *b, size_t n);
void tpr_buf_free(tpr_buf *b);

/* Header and body in one write; 0 or -1. */
int tpr_send(int fd, unsigned type, uint32_t rid, uint32_t word, const void *body, size_t len);
/* A reply with a non-zero status: the body is the message as a str. */
int tpr_send_error(int fd, unsigned type, uint32_t rid, unsigned status, const char *msg);

#endif
