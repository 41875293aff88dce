/* Causal attention of a few query tokens per sequence over an fp32 paged cache: decode and speculative
   verification (the naive twin: kernels/paged_attention/naive.py; prefill stays on torch's flash kernel).
   Dot products and value sums on AVX-512 where built with it and D % 64 == 0, plain C otherwise.

   q [T, Hq, D] contiguous, the query tokens of sequence b at rows cu[b] .. cu[b + 1], its last positions:
   query i of q_len sees keys 0 .. seq_len - q_len + i. Caches [num_blocks, block_size, Hk, D]; key j of
   sequence b sits in page block_table[b, j / block_size]. GQA: query head h reads KV head h / (Hq / Hk);
   a page is read once per pass for all heads (its query heads' rows then come from L1). Softmax in two
   passes over a per-thread score buffer. Several sequences are shared with the helper thread
   (kernels/native_pool.c). Returns 0, -1 (no scratch memory) or -2 (query rows outside [0, T), a length
   or a page id out of range; nothing written). */

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "../native_math.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* s[o] = scale * q . k[o] for n key rows `stride` floats apart */
static void score_rows(const float *q, const float *k, int64_t stride, int64_t n, int64_t D, float scale,
                       float *s) {
#if defined(__AVX512F__)
    if (D % 64 == 0) {
        for (int64_t o = 0; o < n; o++) {
            const float *kr = k + o * stride;
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
            __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
            for (int64_t d = 0; d < D; d += 64) {
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(kr + d), a0);
                a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d + 16), _mm512_loadu_ps(kr + d + 16), a1);
                a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d + 32), _mm512_loadu_ps(kr + d + 32), a2);
                a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d + 48), _mm512_loadu_ps(kr + d + 48), a3);
            }
            s[o] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) * scale;
        }
        return;
    }
#endif
    for (int64_t o = 0; o < n; o++) s[o] = dot_f32(q, k + o * stride, D) * scale;
}

/* acc[:D] += sum over o of w[o] * v[o] for n value rows `stride` floats apart */
static void accumulate_rows(const float *w, const float *v, int64_t stride, int64_t n, int64_t D,
                            float *acc) {
#if defined(__AVX512F__)
    if (D % 64 == 0) {
        for (int64_t d = 0; d < D; d += 64) {
            __m512 a0 = _mm512_loadu_ps(acc + d), a1 = _mm512_loadu_ps(acc + d + 16);
            __m512 a2 = _mm512_loadu_ps(acc + d + 32), a3 = _mm512_loadu_ps(acc + d + 48);
            for (int64_t o = 0; o < n; o++) {
                const float *vr = v + o * stride + d;
                const __m512 wo = _mm512_set1_ps(w[o]);
                a0 = _mm512_fmadd_ps(wo, _mm512_loadu_ps(vr), a0);
                a1 = _mm512_fmadd_ps(wo, _mm512_loadu_ps(vr + 16), a1);
                a2 = _mm512_fmadd_ps(wo, _mm512_loadu_ps(vr + 32), a2);
                a3 = _mm512_fmadd_ps(wo, _mm512_loadu_ps(vr + 48), a3);
            }
            _mm512_storeu_ps(acc + d, a0);
            _mm512_storeu_ps(acc + d + 16, a1);
            _mm512_storeu_ps(acc + d + 32, a2);
            _mm512_storeu_ps(acc + d + 48, a3);
        }
        return;
    }
#endif
    for (int64_t o = 0; o < n; o++)
        for (int64_t d = 0; d < D; d++) acc[d] += w[o] * v[o * stride + d];
}

typedef struct {
    const float *q, *k_cache, *v_cache;
    float *out;
    const int32_t *block_table, *seq_lens, *cu;
    int64_t max_blocks, block_size, Hq, Hk, D;
    float scale;
    _Atomic int failed; /* set when a thread could not get its score buffer */
} attention_job;

/* ask for the next page while this one is computed: pages are scattered, so the hardware prefetcher
   does not see them coming */
static inline void prefetch_page(const float *cache, int64_t page, int64_t floats) {
    const char *start = (const char *)(cache + page * floats);
    for (int64_t off = 0; off < floats * (int64_t)sizeof(float); off += 64) __builtin_prefetch(start + off, 0, 3);
}

/* sequences [b0, b1): each page is visited once per pass for all KV heads, so its slots stream from memory
   in order (a cold cache is read at the hardware prefetcher's pace, not one row's latency at a time) */
static void attend(void *ctx, int64_t b0, int64_t b1) {
    attention_job *j = (attention_job *)ctx;
    const int64_t Hq = j->Hq, Hk = j->Hk, D = j->D, block_size = j->block_size, group = Hq / Hk;
    for (int64_t b = b0; b < b1; b++) {
        const int32_t *pages = j->block_table + b * j->max_blocks;
        const int64_t q_len = j->cu[b + 1] - j->cu[b];
        float *scores = (float *)scratch_bytes((size_t)(Hq * j->seq_lens[b] + 1) * sizeof(float));
        if (!scores) {
            j->failed = 1;
            return;
        }
        for (int64_t i = 0; i < q_len; i++) {
            const int64_t t = j->cu[b] + i, keys = j->seq_lens[b] - q_len + i + 1;
            const float *qt = j->q + t * Hq * D;
            float *ot = j->out + t * Hq * D;
            /* scores[h * keys + key] for every query head h; page by page: no division per key */
            for (int64_t j0 = 0, p = 0; j0 < keys; j0 += block_size, p++) {
                const float *kp = j->k_cache + (int64_t)pages[p] * block_size * Hk * D;
                const int64_t n = keys - j0 < block_size ? keys - j0 : block_size;
                if (j0 + block_size < keys) prefetch_page(j->k_cache, pages[p + 1], block_size * Hk * D);
                for (int64_t h = 0; h < Hq; h++)
                    score_rows(qt + h * D, kp + (h / group) * D, Hk * D, n, D, j->scale, scores + h * keys + j0);
            }
            prefetch_page(j->v_cache, pages[0], block_size * Hk * D); /* arrives during the softmax */
            for (int64_t h = 0; h < Hq; h++) {
                float *s = scores + h * keys;
                const float top = max_f32(s, keys);
                /* separate loops: a running float sum would keep the exp loop from vectorizing */
                for (int64_t k = 0; k < keys; k++) s[k] = exp_poly(s[k] - top);
                const float inv = 1.0f / sum_f32(s, keys);
                for (int64_t k = 0; k < keys; k++) s[k] *= inv;
            }
            memset(ot, 0, (size_t)(Hq * D) * sizeof(float));
            for (int64_t j0 = 0, p = 0; j0 < keys; j0 += block_size, p++) {
                const float *vp = j->v_cache + (int64_t)pages[p] * block_size * Hk * D;
                const int64_t n = keys - j0 < block_size ? keys - j0 : block_size;
                if (j0 + block_size < keys) prefetch_page(j->v_cache, pages[p + 1], block_size * Hk * D);
                for (int64_t h = 0; h < Hq; h++)
                    accumulate_rows(scores + h * keys + j0, vp + (h / group) * D, Hk * D, n, D, ot + h * D);
            }
        }
    }
}

int ninfer_decode_attention(const float *q, float *out, const float *k_cache, const float *v_cache,
                            const int32_t *block_table, const int32_t *seq_lens, const int32_t *cu,
                            int64_t T, int64_t B, int64_t max_blocks, int64_t block_size, int64_t Hq, int64_t Hk,
                            int64_t D, int64_t num_blocks, float scale) {
    if (cu[0] < 0 || cu[B] > T) return -2;
    for (int64_t b = 0; b < B; b++) {
        const int64_t q_len = cu[b + 1] - cu[b], len = seq_lens[b];
        if (q_len < 0 || len < q_len || (len + block_size - 1) / block_size > max_blocks) return -2;
        for (int64_t p = 0; p < (len + block_size - 1) / block_size; p++)
            if (block_table[b * max_blocks + p] < 0 || block_table[b * max_blocks + p] >= num_blocks)
                return -2;
    }
    attention_job job = {q, k_cache, v_cache, out, block_table, seq_lens, cu,
                         max_blocks, block_size, Hq, Hk, D, scale, 0};
    /* one sequence runs on the caller; several are shared with the helper thread */
    pool_run(attend, &job, B, 1);
    return job.failed ? -1 : 0;
}
