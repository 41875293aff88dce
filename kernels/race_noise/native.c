/* Exp(1) noise of the sampling race (the naive twin and the math: kernels/race_noise/naive.py).

   keys [R] (int64, read as their 64-bit pattern); out contiguous [R, V] fp32: out[r, v] = -log(U), U from
   the 32-bit hash of (keys[r], v), the same integers as the twin and the Triton kernel. The log is
   computed here so the loop vectorizes: U = 2^e m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(t),
   t = (m - 1) / (m + 1), |t| < 0.172, as its odd series to t^11 (relative error < 1e-8; accurate for U
   near 1, where the noise is near 0). Returns 0. */

#include <stdint.h>
#include <string.h>

static inline uint32_t fmix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    return x ^ (x >> 16);
}

static inline float neg_log(float u) {
    uint32_t bits;
    memcpy(&bits, &u, 4);
    int32_t e = (int32_t)(bits >> 23) - 127;
    bits = (bits & 0x007FFFFFu) | 0x3F800000u;  /* m in [1, 2) */
    float m;
    memcpy(&m, &bits, 4);
    if (m > 1.41421356f) {
        m *= 0.5f;
        e += 1;
    }
    float t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
    float series = 1.0f + t2 * (1.0f / 3 + t2 * (1.0f / 5 + t2 * (1.0f / 7 + t2 * (1.0f / 9 + t2 * (1.0f / 11)))));
    return -((float)e * 0.69314718f + 2.0f * t * series);
}

int ninfer_race_noise(const int64_t *keys, float *out, int64_t R, int64_t V) {
    for (int64_t r = 0; r < R; r++) {
        uint64_t key = (uint64_t)keys[r];
        uint32_t lo = (uint32_t)key, hi = (uint32_t)(key >> 32);
        float *o = out + r * V;
        for (int64_t v = 0; v < V; v++) {
            uint32_t h = fmix32(fmix32((uint32_t)v * 0x9E3779B9u ^ lo) ^ hi);
            o[v] = neg_log(((float)(h >> 9) + 0.5f) * (1.0f / 8388608.0f));
        }
    }
    return 0;
}
