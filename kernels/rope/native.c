/* Rotary embedding of q and k, NeoX (rotate-half) layout, on fp32 (the naive twin: kernels/rope/naive.py).

   q [T, Hq, D] and k [T, Hk, D] have heads D floats apart and tokens sq / sk floats apart (views into the
   fused qkv output); q_out / k_out are contiguous. cos_sin [P, R]: cos | sin of each position's R / 2
   frequencies; dims from R on pass through. Returns 0, or -2 when a position is outside [0, P)
   (nothing written). */

#include <stdint.h>

static void rotate(const float *x, float *o, const float *cs, int64_t D, int64_t R) {
    const int64_t half = R / 2;
    const float *c = cs, *s = cs + half;
    for (int64_t i = 0; i < half; i++) {
        o[i] = x[i] * c[i] - x[i + half] * s[i];
        o[i + half] = x[i + half] * c[i] + x[i] * s[i];
    }
    for (int64_t i = R; i < D; i++) o[i] = x[i];
}

int ninfer_rope(const float *q, const float *k, float *q_out, float *k_out, const int64_t *positions,
                const float *cos_sin, int64_t T, int64_t Hq, int64_t Hk, int64_t D, int64_t sq, int64_t sk,
                int64_t P, int64_t R) {
    for (int64_t t = 0; t < T; t++)
        if (positions[t] < 0 || positions[t] >= P) return -2;
    for (int64_t t = 0; t < T; t++) {
        const float *cs = cos_sin + positions[t] * R;
        for (int64_t h = 0; h < Hq; h++) rotate(q + t * sq + h * D, q_out + (t * Hq + h) * D, cs, D, R);
        for (int64_t h = 0; h < Hk; h++) rotate(k + t * sk + h * D, k_out + (t * Hk + h) * D, cs, D, R);
    }
    return 0;
}
