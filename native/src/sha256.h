/* SHA-256 (FIPS 180-4), and SHA-1 for device fingerprints that match the Python side's. */
#ifndef TNR_SHA256_H
#define TNR_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t len;
    unsigned char buf[64];
    size_t used;
} tnr_sha256_ctx;

void tnr_sha256_init(tnr_sha256_ctx *c);
void tnr_sha256_update(tnr_sha256_ctx *c, const void *data, size_t n);
void tnr_sha256_final(tnr_sha256_ctx *c, unsigned char out[32]);
/* Lowercase hex digest of data: hex[65]. */
void tnr_sha256_hex(const void *data, size_t n, char hex[65]);
/* HMAC-SHA256 (RFC 2104) of data under key: out[32]. */
void tnr_hmac_sha256(const void *key, size_t keylen, const void *data, size_t n, unsigned char out[32]);
/* SHA-1 lowercase hex digest: hex[41]. */
void tnr_sha1_hex(const void *data, size_t n, char hex[41]);

#endif
