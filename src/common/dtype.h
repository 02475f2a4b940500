/*
 * dtype.h - the element types a variable's values and gradients may
 * travel in (float32, bfloat16, IEEE half), and the loops that convert
 * between them. The ps keeps every variable in float32; a worker whose
 * arrays are bf16 or fp16, or that asks for a narrower wire
 * (qr_worker_set_dtype), sends and receives them so, and both ends
 * convert here.
 *
 * Narrowing rounds to nearest, ties to even, as torch's .to(bfloat16) and
 * .to(float16) do; a value beyond half's range becomes +-inf, and a NaN
 * stays a NaN (quiet, with the top bits of its payload, and its sign).
 * Widening is exact. Each loop is plain C that gcc vectorizes at -O2
 * (no branch in the body: every case is computed and one selected), or
 * F16C's instructions where the compiler targets them.
 */
#ifndef QR_COMMON_DTYPE_H
#define QR_COMMON_DTYPE_H

#include "quorum.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The element size of dtype (QR_FLOAT32, QR_BFLOAT16, QR_FLOAT16), 0 for
 * an unknown one. */
size_t qr_dt_size(int dtype);
/* "float32", "bfloat16", "float16"; "?" for an unknown one. */
const char *qr_dt_name(int dtype);
/* The dtype named ("f32", "float32", "bf16", "bfloat16", "f16",
 * "fp16", "float16"), or -1. */
int qr_dt_parse(const char *name);
/* The bytes n elements of dtype take on the wire: a half-width item is
 * padded to a multiple of 4, so every item of a payload starts at a
 * multiple of 4 as float32 ones do. */
uint64_t qr_dt_wire_bytes(int dtype, uint64_t n);

void qr_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void qr_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
void qr_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void qr_f16_to_f32(float *dst, const uint16_t *src, size_t n);
/* n elements of dtype (any of the three) to or from float32; float32
 * is copied. */
void qr_dt_to_f32(int dtype, float *dst, const void *src, size_t n);
void qr_dt_from_f32(int dtype, void *dst, const float *src, size_t n);
/* No element of the n bf16 or fp16 ones is a NaN or an Inf (a float32
 * array is optim.h's qr_optim_all_finite). */
bool qr_dt_half_all_finite(int dtype, const uint16_t *src, size_t n);

#endif /* QR_COMMON_DTYPE_H */
