/* Exp(1) noise of the sampling race (the naive twin and the math: kernels/race_noise/naive.py).

   keys [R] (int64, read as their 64-bit pattern); out contiguous [R, V] fp32: out[r, v] = -log(U), U from
   the 32-bit hash of (keys[r], v), the same integers as the twin and the Triton kernel. Returns 0. */

#include <math.h>
#include <stdint.h>

static inline uint32_t fmix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    return x ^ (x >> 16);
}

int ninfer_race_noise(const int64_t *keys, float *out, int64_t R, int64_t V) {
    for (int64_t r = 0; r < R; r++) {
        uint64_t key = (uint64_t)keys[r];
        uint32_t lo = (uint32_t)key, hi = (uint32_t)(key >> 32);
        float *o = out + r * V;
        for (int64_t v = 0; v < V; v++) {
            uint32_t h = fmix32(fmix32((uint32_t)v * 0x9E3779B9u ^ lo) ^ hi);
            o[v] = -logf(((float)(h >> 9) + 0.5f) * (1.0f / 8388608.0f));
        }
    }
    return 0;
}
