/* The gated delta rule, token by token (the recurrent form), for packed variable-length sequences on the
   CPU (the naive twin: kernels/gated_delta/naive.py; the same math, summed in another order).

   Per sequence b and value head h (query / key head h / (Hv / Hk)), state S [Dk, Dv] of slot
   state_indices[b], for each of its tokens t:
       q, k <- q / |q|, k / |k| (with use_l2norm; |x| = sqrt(sum x^2 + 1e-6)), q <- q / sqrt(Dk)
       S <- exp(g_t) S;  delta = beta_t (v_t - S^T k);  S <- S + k delta^T;  o_t = S^T q
   in two passes over S a token: decay and S^T k together, then the update and S^T q together. q / k / v
   rows are token_stride floats apart with heads D apart (views into the conv output); g and beta [T, Hv],
   out [T, Hv, Dv], state [num_slots, Hv, Dk, Dv], all fp32. The (sequence, head) pairs are the pool's work
   items (kernels/native_pool.c). A sequence of slot -1 is padding: zero outputs, no state read or written.
   Returns 0, or -2 for a slot or token range out of bounds (nothing written). */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../native_math.h"

#define MAX_DIM 512 /* head dims held on the stack */

typedef struct {
    const float *q, *k, *v, *g, *beta;
    float *state, *out;
    const int32_t *cu, *slots;
    int64_t Hk, Hv, Dk, Dv, sq, sk, sv;
    int l2norm;
} delta_job;

/* x [n] scaled to unit length (as the twin: x / sqrt(sum x^2 + 1e-6)) times `extra` */
static void normalized(const float *x, int64_t n, int l2norm, float extra, float *y) {
    float scale = extra;
    if (l2norm) scale /= sqrtf(dot_f32(x, x, n) + 1e-6f);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

static void run_heads(void *ctx, int64_t i0, int64_t i1) {
    const delta_job *j = (const delta_job *)ctx;
    const int64_t Hv = j->Hv, Dk = j->Dk, Dv = j->Dv, rep = j->Hv / j->Hk;
    float qn[MAX_DIM], kn[MAX_DIM], mem[MAX_DIM], delta[MAX_DIM];
    for (int64_t item = i0; item < i1; item++) {
        const int64_t b = item / Hv, h = item % Hv, kh = h / rep;
        if (j->slots[b] < 0) {
            for (int64_t t = j->cu[b]; t < j->cu[b + 1]; t++)
                memset(j->out + (t * Hv + h) * Dv, 0, (size_t)Dv * sizeof(float));
            continue;
        }
        float *S = j->state + ((int64_t)j->slots[b] * Hv + h) * Dk * Dv;
        for (int64_t t = j->cu[b]; t < j->cu[b + 1]; t++) {
            normalized(j->q + t * j->sq + kh * Dk, Dk, j->l2norm, 1.0f / sqrtf((float)Dk), qn);
            normalized(j->k + t * j->sk + kh * Dk, Dk, j->l2norm, 1.0f, kn);
            const float decay = expf(j->g[t * Hv + h]), beta = j->beta[t * Hv + h];
            const float *v = j->v + t * j->sv + h * Dv;
            float *o = j->out + (t * Hv + h) * Dv;
            memset(mem, 0, (size_t)Dv * sizeof(float));
            for (int64_t i = 0; i < Dk; i++) { /* S <- decay S; mem = S^T k */
                float *row = S + i * Dv;
                for (int64_t d = 0; d < Dv; d++) {
                    row[d] *= decay;
                    mem[d] += row[d] * kn[i];
                }
            }
            for (int64_t d = 0; d < Dv; d++) delta[d] = (v[d] - mem[d]) * beta;
            memset(o, 0, (size_t)Dv * sizeof(float));
            for (int64_t i = 0; i < Dk; i++) { /* S <- S + k delta^T; o = S^T q */
                float *row = S + i * Dv;
                for (int64_t d = 0; d < Dv; d++) {
                    row[d] += kn[i] * delta[d];
                    o[d] += row[d] * qn[i];
                }
            }
        }
    }
}

int ninfer_gated_delta_rule(const float *q, const float *k, const float *v, const float *g, const float *beta,
                            float *state, float *out, const int32_t *cu, const int32_t *slots, int64_t T,
                            int64_t B, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, int64_t sq, int64_t sk,
                            int64_t sv, int64_t num_slots, int64_t l2norm) {
    if (Dk > MAX_DIM || Dv > MAX_DIM || Hk <= 0 || Hv % Hk || cu[0] < 0 || cu[B] > T) return -2;
    for (int64_t b = 0; b < B; b++)
        if (cu[b + 1] < cu[b] || slots[b] < -1 || slots[b] >= num_slots) return -2;
    delta_job job = {q, k, v, g, beta, state, out, cu, slots, Hk, Hv, Dk, Dv, sq, sk, sv, (int)l2norm};
    pool_run(run_heads, &job, B * Hv, 1);
    return 0;
}
