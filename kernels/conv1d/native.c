/* Depthwise causal conv1d (+ SiLU) over packed variable-length sequences, continuing from and updating each
   sequence's conv state (the naive twin: kernels/conv1d/naive.py).

   x [T, C] rows x_stride floats apart (a view into the fused input projection), weight [C, K], state
   [num_slots, C, K - 1] (the last K - 1 inputs of each sequence, oldest first), out [T, C] contiguous, all
   fp32. y[t, c] = sum over j of weight[c, j] * window[j], the window being the K inputs up to t. The
   (sequence, block of channels) pairs are the pool's work items. A sequence of slot -1 is padding: zero
   outputs, no state read or written. Returns 0, or -2 for a slot or token range out of bounds or K past
   MAX_KERNEL (nothing written). */

#include <math.h>
#include <stdint.h>

#include "../native_math.h"

#define MAX_KERNEL 16
#define CHANNEL_BLOCK 256

typedef struct {
    const float *x, *weight;
    float *state, *out;
    const int32_t *cu, *slots;
    int64_t C, K, x_stride, blocks;
    int silu;
} conv_job;

static void run_channels(void *ctx, int64_t i0, int64_t i1) {
    const conv_job *j = (const conv_job *)ctx;
    const int64_t C = j->C, K = j->K;
    for (int64_t item = i0; item < i1; item++) {
        const int64_t b = item / j->blocks, c0 = item % j->blocks * CHANNEL_BLOCK;
        const int64_t c1 = c0 + CHANNEL_BLOCK < C ? c0 + CHANNEL_BLOCK : C, t0 = j->cu[b], t1 = j->cu[b + 1];
        if (t1 == t0) continue;
        if (j->slots[b] < 0) {
            for (int64_t t = t0; t < t1; t++)
                for (int64_t c = c0; c < c1; c++) j->out[t * C + c] = 0.0f;
            continue;
        }
        float *state = j->state + (int64_t)j->slots[b] * C * (K - 1);
        for (int64_t c = c0; c < c1; c++) {
            float window[MAX_KERNEL];
            const float *w = j->weight + c * K;
            for (int64_t i = 0; i < K - 1; i++) window[i] = state[c * (K - 1) + i];
            for (int64_t t = t0; t < t1; t++) {
                window[K - 1] = j->x[t * j->x_stride + c];
                float y = 0.0f;
                for (int64_t i = 0; i < K; i++) y += w[i] * window[i];
                j->out[t * C + c] = j->silu ? y / (1.0f + expf(-y)) : y;
                for (int64_t i = 0; i < K - 1; i++) window[i] = window[i + 1];
            }
            for (int64_t i = 0; i < K - 1; i++) state[c * (K - 1) + i] = window[i];
        }
    }
}

int ninfer_causal_conv1d(const float *x, const float *weight, float *state, float *out, const int32_t *cu,
                         const int32_t *slots, int64_t T, int64_t B, int64_t C, int64_t K, int64_t x_stride,
                         int64_t num_slots, int64_t silu) {
    if (K < 1 || K > MAX_KERNEL || cu[0] < 0 || cu[B] > T) return -2;
    for (int64_t b = 0; b < B; b++)
        if (cu[b + 1] < cu[b] || slots[b] < -1 || slots[b] >= num_slots) return -2;
    const int64_t blocks = (C + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK;
    conv_job job = {x, weight, state, out, cu, slots, C, K, x_stride, blocks, (int)silu};
    pool_run(run_channels, &job, B * blocks, 1);
    return 0;
}
