/* Store a step's K and V rows into a paged cache, quantizing for its KV dtype (the naive twin:
   kernels/kv_store/naive.py, with kernels/kv_quant/naive.py's quantizers; the same bits).

   k / v [T, Hk, D] fp32, token rows sk / sv floats apart (views into the fused qkv output), heads D apart;
   the caches are [num_slots, Hk, D'] (pages of block_size slots, flattened): fp32, bf16 or fp16 values;
   int8 codes with one fp16 scale per slot and head; k8v4: K as int8, V as int4 in groups of V4_GROUP dims
   (two a byte, the even dim in the low nibble, code + 8) with one fp16 scale per group. slots[t] < 0:
   token t has no slot (padding). Returns 0, or -2 when a slot is past the cache or the mode is unknown
   (nothing written). */

#include <stdint.h>
#include <string.h>

#include "../native_math.h"

#define MIN_SCALE 0x1p-14f /* the smallest normal fp16: an all-zero row keeps a usable scale */

/* symmetric codes of n values in [-limit, limit]: scale = max|x| / limit as fp16, code = round(x / scale) */
static uint16_t quantize(const float *x, int64_t n, float limit, int8_t *codes) {
    float top = 0.0f;
    for (int64_t i = 0; i < n; i++) top = fabsf(x[i]) > top ? fabsf(x[i]) : top;
    float scale = top / limit;
    scale = scale < MIN_SCALE ? MIN_SCALE : scale;
    const uint16_t half = f32_to_f16(scale);
    const float s = f16_to_f32(half);
    for (int64_t i = 0; i < n; i++) {
        const float r = rintf(x[i] / s);
        codes[i] = r != r ? 0 : (int8_t)(r > limit ? limit : (r < -limit ? -limit : r)); /* NaN: 0, defined */
    }
    return half;
}

/* one row of Hk heads of D values into slot `slot` of a cache */
static void store_row(const float *x, void *cache, uint16_t *scale, int64_t slot, int64_t Hk, int64_t D, int mode,
                      int value) {
    const int64_t n = Hk * D;
    if (mode == KV_FP32) {
        memcpy((float *)cache + slot * n, x, (size_t)n * sizeof(float));
    } else if (mode == KV_BF16 || mode == KV_FP16) {
        uint16_t *dst = (uint16_t *)cache + slot * n;
        if (mode == KV_BF16)
            for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16(x[i]);
        else
            for (int64_t i = 0; i < n; i++) dst[i] = f32_to_f16(x[i]);
    } else if (mode == KV_INT8 || !value) {
        for (int64_t h = 0; h < Hk; h++)
            scale[slot * Hk + h] = quantize(x + h * D, D, 127.0f, (int8_t *)cache + slot * n + h * D);
    } else {
        const int64_t groups = D / V4_GROUP;
        uint8_t *dst = (uint8_t *)cache + slot * n / 2;
        int8_t codes[V4_GROUP];
        for (int64_t h = 0; h < Hk; h++)
            for (int64_t g = 0; g < groups; g++) {
                scale[(slot * Hk + h) * groups + g] = quantize(x + h * D + g * V4_GROUP, V4_GROUP, 7.0f, codes);
                uint8_t *out = dst + h * D / 2 + g * V4_GROUP / 2;
                for (int i = 0; i < V4_GROUP / 2; i++)
                    out[i] = (uint8_t)((codes[2 * i] + 8) | ((codes[2 * i + 1] + 8) << 4));
            }
    }
}

int ninfer_kv_store(const float *k, const float *v, void *k_cache, void *v_cache, uint16_t *k_scale, uint16_t *v_scale,
                    const int64_t *slots, int64_t T, int64_t sk, int64_t sv, int64_t Hk, int64_t D, int64_t num_slots,
                    int64_t mode) {
    if (mode < KV_FP32 || mode > KV_K8V4 || (mode == KV_K8V4 && D % V4_GROUP)) return -2;
    for (int64_t t = 0; t < T; t++)
        if (slots[t] >= num_slots) return -2;
    for (int64_t t = 0; t < T; t++) {
        if (slots[t] < 0) continue;
        store_row(k + t * sk, k_cache, k_scale, slots[t], Hk, D, (int)mode, 0);
        store_row(v + t * sv, v_cache, v_scale, slots[t], Hk, D, (int)mode, 1);
    }
    return 0;
}
