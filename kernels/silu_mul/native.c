/* silu(gate) * up over rows [gate | up] of fp32 (the naive twin: kernels/silu_mul/naive.py).

   x rows are `x_stride` floats apart, each [gate (I) | up (I)]; out is contiguous [T, I]. Returns 0. */

#include <stdint.h>

#include "../native_math.h"

int ninfer_silu_mul(const float *x, float *out, int64_t T, int64_t I, int64_t x_stride) {
    for (int64_t t = 0; t < T; t++) {
        const float *gate = x + t * x_stride, *up = gate + I;
        float *o = out + t * I;
        for (int64_t i = 0; i < I; i++) o[i] = gate[i] / (1.0f + exp_poly(-gate[i])) * up[i];
    }
    return 0;
}
