/* Shared by the native CPU ops (kernels/<op>/native.c). */
#ifndef NINFER_NATIVE_MATH_H
#define NINFER_NATIVE_MATH_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* e^x: a degree-6 polynomial on x = n ln2 + r, |r| <= ln2 / 2 (relative error ~1e-7), written so the
   compiler vectorizes the loops that call it; libm's expf runs one value at a time. x is clamped to
   [-87, 88] (e^-87 is still a normal float). */
static inline float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = rintf(x * 1.44269504088896341f);
    const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } two_n = {.i = ((int32_t)n + 127) << 23};
    return p * two_n.f;
}

/* fixed-order reductions in 16 lanes (the tail of n % 16 goes to the first lanes), then a fixed tree
   (8 + 8, 4 + 4, ...): the compiler keeps them in vector registers, where a running scalar would be n
   dependent operations */
static inline float sum_f32(const float *a, int64_t n) {
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] += a[i + l];
    for (int l = 0; i < n; i++, l++) lanes[l] += a[i];
    for (int w = 8; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lanes[l] += lanes[l + w];
    return lanes[0];
}

static inline float max_f32(const float *a, int64_t n) {
    float lanes[16];
    for (int l = 0; l < 16; l++) lanes[l] = a[0];
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] = a[i + l] > lanes[l] ? a[i + l] : lanes[l];
    for (int l = 0; i < n; i++, l++) lanes[l] = a[i] > lanes[l] ? a[i] : lanes[l];
    for (int w = 8; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lanes[l] = lanes[l + w] > lanes[l] ? lanes[l + w] : lanes[l];
    return lanes[0];
}

/* sum of a[i] * b[i], the same way */
static inline float dot_f32(const float *a, const float *b, int64_t n) {
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) lanes[l] += a[i] * b[i];
    for (int w = 8; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lanes[l] += lanes[l + w];
    return lanes[0];
}

/* KV cache dtypes of kv_store and decode attention (engine/cache/kv_layout.py; native_build.KV_MODES
   numbers them the same); k8v4's V shares one fp16 scale per V4_GROUP dims (kernels/kv_quant/naive.py) */
enum { KV_FP32, KV_BF16, KV_FP16, KV_INT8, KV_K8V4 };
#define V4_GROUP 32

/* IEEE half and bfloat16 bits <-> float, rounding to nearest even as torch converts (plain C: the library
   also builds where no half-precision type or instruction is at hand) */
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24, exact */
        const float v = (float)mantissa * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exponent == 31) return bits_f32(sign | 0x7F800000u | (mantissa << 13));
    return bits_f32(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000;
    x &= 0x7FFFFFFF;
    if (x >= 0x47800000u) /* 65536 and beyond (65520 and up round there below), inf, NaN */
        return (uint16_t)(sign | (x > 0x7F800000u ? 0x7E00 : 0x7C00));
    if (x < 0x38800000u) { /* below 2^-14: subnormal; adding 0.5 leaves x * 2^24 rounded in the low bits */
        return (uint16_t)(sign | (f32_bits(bits_f32(x) + 0.5f) - 0x3F000000u));
    }
    x += 0xC8000FFFu + ((x >> 13) & 1); /* rebias the exponent by -112, round half to even */
    return (uint16_t)(sign | (x >> 13));
}

static inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFF) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

/* per-thread buffers of at least `bytes`, kept between calls (NULL when allocation fails); a caller that
   needs two at once takes two slots */
#define SCRATCH_SLOTS 3
static inline void *scratch_slot(int slot, size_t bytes) {
    static __thread void *buf[SCRATCH_SLOTS];
    static __thread size_t cap[SCRATCH_SLOTS];
    if (bytes > cap[slot]) {
        free(buf[slot]);
        cap[slot] = (bytes + 63) / 64 * 64;
        buf[slot] = aligned_alloc(64, cap[slot]);
        if (!buf[slot]) cap[slot] = 0;
    }
    return buf[slot];
}

static inline void *scratch_bytes(size_t bytes) { return scratch_slot(0, bytes); }

/* kernels/native_pool.c: fn(ctx, i0, i1) over [0, n) in chunks, on the caller and a helper thread */
typedef void (*pool_fn)(void *ctx, int64_t i0, int64_t i1);
void pool_run(pool_fn fn, void *ctx, int64_t n, int64_t chunk);

#endif
