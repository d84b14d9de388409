#include "half.h"

#include <string.h>

uint16_t tnr_float_to_half(float f) {
    uint32_t x, sign, exp, man;
    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000u;
    exp = (x >> 23) & 0xFFu;
    man = x & 0x7FFFFFu;
    if (exp == 0xFF) /* inf or NaN (keep a quiet NaN) */
        return (uint16_t)(sign | 0x7C00u | (man ? 0x200u | (man >> 13) : 0));
    if (exp > 142) return (uint16_t)(sign | 0x7C00u); /* >= 2^16: overflow */
    if (exp >= 113) {                                 /* normal half: exponent 1..30 */
        uint32_t h = ((exp - 112) << 10) | (man >> 13);
        uint32_t rest = man & 0x1FFFu; /* the 13 dropped bits */
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* may carry into the exponent: right */
        return (uint16_t)(sign | h);
    }
    if (exp >= 102) { /* subnormal half (or rounds up to the smallest normal) */
        uint32_t m = man | 0x800000u; /* implicit bit */
        uint32_t shift = 126 - exp;   /* 14..24 */
        uint32_t h = m >> shift;
        uint32_t rest = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    return (uint16_t)sign; /* underflow to signed zero */
}

float tnr_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, x;
    float f;
    if (exp == 0x1F) x = sign | 0x7F800000u | (man << 13);
    else if (exp) x = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) x = sign;
    else { /* subnormal: normalize */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        x = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13);
    }
    memcpy(&f, &x, 4);
    return f;
}

void tnr_floats_to_halves(const float *src, uint16_t *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = tnr_float_to_half(src[i]);
}

void tnr_halves_to_floats(const uint16_t *src, float *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = tnr_half_to_float(src[i]);
}
