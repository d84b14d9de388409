#include "sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
#define ROL(x, n) (((x) << (n)) | ((x) >> (32 - (n))))

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void block256(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, k;
    int i;
    for (i = 0; i < 16; i++) w[i] = be32(p + 4 * i);
    for (i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void tnr_sha256_init(tnr_sha256_ctx *c) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof iv);
    c->len = 0;
    c->used = 0;
}

void tnr_sha256_update(tnr_sha256_ctx *c, const void *data, size_t n) {
    const unsigned char *p = data;
    c->len += n;
    if (c->used) {
        size_t take = 64 - c->used < n ? 64 - c->used : n;
        memcpy(c->buf + c->used, p, take);
        c->used += take, p += take, n -= take;
        if (c->used < 64) return;
        block256(c->h, c->buf);
        c->used = 0;
    }
    for (; n >= 64; p += 64, n -= 64) block256(c->h, p);
    memcpy(c->buf, p, n);
    c->used = n;
}

static void pad(unsigned char *buf, size_t *used, uint64_t bits, uint32_t *h, void (*blk)(uint32_t *, const unsigned char *)) {
    int i;
    buf[(*used)++] = 0x80;
    if (*used > 56) {
        memset(buf + *used, 0, 64 - *used);
        blk(h, buf);
        *used = 0;
    }
    memset(buf + *used, 0, 56 - *used);
    for (i = 0; i < 8; i++) buf[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    blk(h, buf);
}

void tnr_sha256_final(tnr_sha256_ctx *c, unsigned char out[32]) {
    int i;
    pad(c->buf, &c->used, c->len * 8, c->h, block256);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(c->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)c->h[i];
    }
}

static void to_hex(const unsigned char *d, size_t n, char *hex) {
    static const char digits[] = "0123456789abcdef";
    size_t i;
    for (i = 0; i < n; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[2 * n] = 0;
}

void tnr_sha256_hex(const void *data, size_t n, char hex[65]) {
    tnr_sha256_ctx c;
    unsigned char d[32];
    tnr_sha256_init(&c);
    tnr_sha256_update(&c, data, n);
    tnr_sha256_final(&c, d);
    to_hex(d, 32, hex);
}

static void block1(uint32_t *h, const unsigned char *p) {
    uint32_t w[80], a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    int i;
    for (i = 0; i < 16; i++) w[i] = be32(p + 4 * i);
    for (i = 16; i < 80; i++) w[i] = ROL(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    for (i = 0; i < 80; i++) {
        uint32_t f, k, t;
        if (i < 20) f = (b & c) | (~b & d), k = 0x5a827999;
        else if (i < 40) f = b ^ c ^ d, k = 0x6ed9eba1;
        else if (i < 60) f = (b & c) | (b & d) | (c & d), k = 0x8f1bbcdc;
        else f = b ^ c ^ d, k = 0xca62c1d6;
        t = ROL(a, 5) + f + e + k + w[i];
        e = d, d = c, c = ROL(b, 30), b = a, a = t;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
}

void tnr_sha1_hex(const void *data, size_t n, char hex[41]) {
    uint32_t h[5] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0};
    unsigned char buf[64], d[20];
    const unsigned char *p = data;
    size_t rest = n, used;
    int i;
    for (; rest >= 64; p += 64, rest -= 64) block1(h, p);
    memcpy(buf, p, rest);
    used = rest;
    pad(buf, &used, (uint64_t)n * 8, h, block1);
    for (i = 0; i < 5; i++) {
        d[4 * i] = (unsigned char)(h[i] >> 24);
        d[4 * i + 1] = (unsigned char)(h[i] >> 16);
        d[4 * i + 2] = (unsigned char)(h[i] >> 8);
        d[4 * i + 3] = (unsigned char)h[i];
    }
    to_hex(d, 20, hex);
}

void tnr_hmac_sha256(const void *key, size_t keylen, const void *data, size_t n, unsigned char out[32]) {
    unsigned char k[64], pad[64], inner[32];
    tnr_sha256_ctx c;
    size_t i;
    memset(k, 0, sizeof k);
    if (keylen > 64) {
        tnr_sha256_init(&c);
        tnr_sha256_update(&c, key, keylen);
        tnr_sha256_final(&c, k);
    } else if (keylen) {
        memcpy(k, key, keylen);
    }
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x36);
    tnr_sha256_init(&c);
    tnr_sha256_update(&c, pad, 64);
    tnr_sha256_update(&c, data, n);
    tnr_sha256_final(&c, inner);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x5c);
    tnr_sha256_init(&c);
    tnr_sha256_update(&c, pad, 64);
    tnr_sha256_update(&c, inner, 32);
    tnr_sha256_final(&c, out);
}
