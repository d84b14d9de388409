/* float32 <-> IEEE 754 binary16, round to nearest even (NaN stays NaN, overflow goes to infinity). */
#ifndef TNR_HALF_H
#define TNR_HALF_H

#include <stddef.h>
#include <stdint.h>

uint16_t tnr_float_to_half(float f);
float tnr_half_to_float(uint16_t h);
void tnr_floats_to_halves(const float *src, uint16_t *dst, size_t n);
void tnr_halves_to_floats(const uint16_t *src, float *dst, size_t n);

#endif
