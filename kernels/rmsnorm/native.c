/* RMSNorm over rows of fp32, optionally after a residual add (the naive twin: kernels/rmsnorm/naive.py).

   out = x / sqrt(mean(x^2) + eps) * w   (w + 1 when zero_centered), with x = x + residual first when a
   residual is given (then stored to new_residual). Rows of x are `x_stride` floats apart; the other
   tensors are contiguous [T, D]. Also the gated variant of the Gated DeltaNet output (below). Returns 0. */

#include <math.h>
#include <stdint.h>

#include "../native_math.h"

int ninfer_rmsnorm(const float *x, const float *residual, const float *weight, float *out,
                   float *new_residual, int64_t T, int64_t D, int64_t x_stride, float eps,
                   int64_t zero_centered) {
    for (int64_t t = 0; t < T; t++) {
        const float *row = x + t * x_stride;
        float *o = out + t * D;
        if (residual) {
            float *nr = new_residual + t * D;
            const float *r = residual + t * D;
            for (int64_t i = 0; i < D; i++) nr[i] = row[i] + r[i];
            row = nr;
        }
        const float ss = dot_f32(row, row, D);
        const float inv = 1.0f / sqrtf(ss / (float)D + eps);
        if (zero_centered)
            for (int64_t i = 0; i < D; i++) o[i] = row[i] * inv * (1.0f + weight[i]);
        else
            for (int64_t i = 0; i < D; i++) o[i] = row[i] * inv * weight[i];
    }
    return 0;
}

/* weight * rmsnorm(x) * silu(gate) per head row (Qwen3.5's Gated DeltaNet output): x [T, H, D] contiguous,
   gate [T, H, D] with heads D apart and tokens gate_stride apart (a view into the input projection). */
int ninfer_rmsnorm_gated(const float *x, const float *gate, const float *weight, float *out, int64_t T, int64_t H,
                         int64_t D, int64_t gate_stride, float eps) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const float *row = x + (t * H + h) * D, *z = gate + t * gate_stride + h * D;
            float *o = out + (t * H + h) * D;
            const float inv = 1.0f / sqrtf(dot_f32(row, row, D) / (float)D + eps);
            for (int64_t i = 0; i < D; i++) o[i] = weight[i] * (row[i] * inv) * (z[i] / (1.0f + expf(-z[i])));
        }
    return 0;
}
