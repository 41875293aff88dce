/* Causal attention of a few query tokens per sequence over a paged cache: decode and speculative
   verification (the naive twin: kernels/paged_attention/naive.py; prefill stays on torch's flash kernel).
   Dot products and value sums on AVX-512 where built with it and D % 64 == 0, plain C otherwise. Every
   KV dtype of engine/cache/kv_layout.py but fp8: an fp32 cache is read in place, the others one page at a
   time into a per-thread fp32 page (the page is then read once for every query head of its group).

   q [T, Hq, D] contiguous, the query tokens of sequence b at rows cu[b] .. cu[b + 1], its last positions:
   query i of q_len sees keys 0 .. seq_len - q_len + i. Caches [num_blocks, block_size, Hk, D]; key j of
   sequence b sits in page block_table[b, j / block_size]. GQA: query head h reads KV head h / (Hq / Hk);
   a page is read once per pass for all heads (its query heads' rows then come from L1). Softmax in two
   passes over a per-thread score buffer. A sequence longer than PART_KEYS splits into parts of that many
   keys (flash-decoding): each part's max, sum and unnormalized outputs are merged once all have run, so
   one long sequence keeps every thread of the pool busy (kernels/native_pool.c). The split depends on
   the sequence's own length alone: a sequence gets the same bits alone or batched. Returns 0, -1 (no scratch memory) or -2 (query rows outside [0, T), a length
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

/* keys a work item covers (rounded to whole pages): a long sequence splits into parts that run on
   different threads (flash-decoding), and a part's scores stay in L1 */
#define PART_KEYS 256

typedef struct {
    const float *q;
    const void *k_cache, *v_cache;
    const uint16_t *k_scale, *v_scale; /* fp16, per slot and head (k8v4's V: per V4_GROUP dims) */
    int mode;
    float *out;
    const int32_t *block_table, *seq_lens, *cu;
    int64_t max_blocks, block_size, Hq, Hk, D;
    float scale;
    int64_t part_pages;   /* pages a part covers */
    const int64_t *first;  /* [B + 1]: sequence b's parts are work items first[b] .. first[b + 1] */
    const int64_t *offset; /* [B]: sequence b's first partial result (see partial_of) */
    float *partial;        /* per part and query token, per head: max, sum, then D unnormalized outputs */
    _Atomic int failed;   /* set when a thread could not get its score buffer */
} attention_job;

/* bytes a slot's Hk rows take in the K (or V) cache */
static inline int64_t slot_bytes(const attention_job *j, int value) {
    static const int64_t elem[] = {4, 2, 2, 1, 1};
    return value && j->mode == KV_K8V4 ? j->Hk * j->D / 2 : j->Hk * j->D * elem[j->mode];
}

/* ask for the next page while this one is computed: pages are scattered, so the hardware prefetcher
   does not see them coming; into L2 (asking for L1 held up the loads of the page being computed) */
static inline void prefetch_page(const attention_job *j, int value, int64_t page) {
    const int64_t bytes = j->block_size * slot_bytes(j, value);
    const char *start = (const char *)(value ? j->v_cache : j->k_cache) + page * bytes;
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(start + off, 0, 1);
}

/* the first m slots of a page as fp32 [m, Hk, D]: in place for an fp32 cache, else dequantized into buf
   (the same products as the naive twin's: an int8 or int4 code times its fp16 scale is exact in fp32) */
static const float *page_f32(const attention_job *j, int value, int64_t page, int64_t m, float *buf) {
    const int64_t Hk = j->Hk, D = j->D, rows = m * Hk, first = page * j->block_size * Hk;
    const void *cache = value ? j->v_cache : j->k_cache;
    const uint16_t *scale = value ? j->v_scale : j->k_scale;
    if (j->mode == KV_FP32) return (const float *)cache + first * D;
    if (j->mode == KV_BF16 || j->mode == KV_FP16) {
        const uint16_t *src = (const uint16_t *)cache + first * D;
        if (j->mode == KV_BF16)
            for (int64_t i = 0; i < rows * D; i++) buf[i] = bf16_to_f32(src[i]);
        else
            for (int64_t i = 0; i < rows * D; i++) buf[i] = f16_to_f32(src[i]);
    } else if (!value || j->mode == KV_INT8) {
        const int8_t *src = (const int8_t *)cache + first * D;
        for (int64_t r = 0; r < rows; r++) {
            const float s = f16_to_f32(scale[first + r]);
            for (int64_t d = 0; d < D; d++) buf[r * D + d] = (float)src[r * D + d] * s;
        }
    } else { /* k8v4's V: two dims a byte, the even one in the low nibble, code - 8 */
        const uint8_t *src = (const uint8_t *)cache + first * D / 2;
        const int64_t groups = D / V4_GROUP;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t g = 0; g < groups; g++) {
                const float s = f16_to_f32(scale[(first + r) * groups + g]);
                const uint8_t *in = src + r * D / 2 + g * V4_GROUP / 2;
                float *o = buf + r * D + g * V4_GROUP;
                for (int64_t i = 0; i < V4_GROUP / 2; i++) {
                    o[2 * i] = (float)((int)(in[i] & 15) - 8) * s;
                    o[2 * i + 1] = (float)((int)(in[i] >> 4) - 8) * s;
                }
            }
    }
    return buf;
}

/* sequence b's keys [k0, k0 + n) for its query token i (row t): the softmax over them; where the part is
   the whole sequence, normalized into out; else its max, sum and unnormalized outputs into dst */
static void attend_keys(const attention_job *j, const int32_t *pages, int64_t t, int64_t k0, int64_t n,
                        float *scores, float *page, float *dst) {
    const int64_t Hq = j->Hq, Hk = j->Hk, D = j->D, bs = j->block_size, group = Hq / Hk;
    const int64_t p0 = k0 / bs, stride = dst ? D + 2 : D;
    const float *qt = j->q + t * Hq * D;
    float *o = dst ? dst + 2 : j->out + t * Hq * D;
    /* scores[h * n + key] for every query head h; page by page: no division per key */
    for (int64_t j0 = 0, p = p0; j0 < n; j0 += bs, p++) {
        const int64_t m = n - j0 < bs ? n - j0 : bs;
        const float *kp = page_f32(j, 0, pages[p], m, page);
        if (j0 + bs < n) prefetch_page(j, 0, pages[p + 1]);
        for (int64_t h = 0; h < Hq; h++)
            score_rows(qt + h * D, kp + (h / group) * D, Hk * D, m, D, j->scale, scores + h * n + j0);
    }
    prefetch_page(j, 1, pages[p0]); /* arrives during the softmax */
    for (int64_t h = 0; h < Hq; h++) {
        float *s = scores + h * n;
        const float top = max_f32(s, n);
        /* separate loops: a running float sum would keep the exp loop from vectorizing */
        for (int64_t k = 0; k < n; k++) s[k] = exp_poly(s[k] - top);
        const float total = sum_f32(s, n);
        if (dst) {
            dst[h * stride] = top, dst[h * stride + 1] = total;
        } else {
            const float inv = 1.0f / total;
            for (int64_t k = 0; k < n; k++) s[k] *= inv;
        }
        memset(o + h * stride, 0, (size_t)D * sizeof(float));
    }
    for (int64_t j0 = 0, p = p0; j0 < n; j0 += bs, p++) {
        const int64_t m = n - j0 < bs ? n - j0 : bs;
        const float *vp = page_f32(j, 1, pages[p], m, page);
        if (j0 + bs < n) prefetch_page(j, 1, pages[p + 1]);
        for (int64_t h = 0; h < Hq; h++)
            accumulate_rows(scores + h * n + j0, vp + (h / group) * D, Hk * D, m, D, o + h * stride);
    }
}

/* the partial result of sequence b's part `part` for its query token i: Hq x (max, sum, D outputs) */
static inline float *partial_of(const attention_job *j, int64_t b, int64_t part, int64_t i) {
    const int64_t q_len = j->cu[b + 1] - j->cu[b];
    return j->partial + (j->offset[b] + part * q_len + i) * j->Hq * (j->D + 2);
}

/* work items [i0, i1): one part of one sequence each */
static void attend(void *ctx, int64_t i0, int64_t i1) {
    attention_job *j = (attention_job *)ctx;
    const int64_t part_keys = j->part_pages * j->block_size;
    float *scores = (float *)scratch_bytes((size_t)(j->Hq * part_keys) * sizeof(float));
    float *page = j->mode == KV_FP32 ? NULL : (float *)scratch_slot(2, (size_t)(j->block_size * j->Hk * j->D) * sizeof(float));
    if (!scores || (j->mode != KV_FP32 && !page)) {
        j->failed = 1;
        return;
    }
    int64_t b = 0;
    for (int64_t item = i0; item < i1; item++) {
        while (j->first[b + 1] <= item) b++;
        const int64_t part = item - j->first[b], whole = j->first[b + 1] - j->first[b] == 1;
        const int64_t q_len = j->cu[b + 1] - j->cu[b], k0 = part * part_keys;
        const int32_t *pages = j->block_table + b * j->max_blocks;
        for (int64_t i = 0; i < q_len; i++) {
            /* query i of q_len sees keys 0 .. seq_len - q_len + i */
            const int64_t keys = j->seq_lens[b] - q_len + i + 1;
            const int64_t n = (k0 + part_keys < keys ? k0 + part_keys : keys) - k0;
            float *dst = whole ? NULL : partial_of(j, b, part, i);
            if (n > 0) {
                attend_keys(j, pages, j->cu[b] + i, k0, n, scores, page, dst);
            } else { /* a verification row that ends before this part: nothing to add */
                for (int64_t h = 0; h < j->Hq; h++) dst[h * (j->D + 2)] = -INFINITY, dst[h * (j->D + 2) + 1] = 0.0f;
            }
        }
    }
}

/* out = sum over parts of e^(max_p - max) o_p / sum over parts of e^(max_p - max) sum_p */
static void merge_parts(const attention_job *j, int64_t b) {
    const int64_t Hq = j->Hq, D = j->D, parts = j->first[b + 1] - j->first[b], q_len = j->cu[b + 1] - j->cu[b];
    for (int64_t i = 0; i < q_len; i++)
        for (int64_t h = 0; h < Hq; h++) {
            float top = -INFINITY, total = 0.0f;
            for (int64_t p = 0; p < parts; p++) {
                const float m = partial_of(j, b, p, i)[h * (D + 2)];
                top = m > top ? m : top;
            }
            float *o = j->out + (j->cu[b] + i) * Hq * D + h * D;
            memset(o, 0, (size_t)D * sizeof(float));
            for (int64_t p = 0; p < parts; p++) {
                const float *part = partial_of(j, b, p, i) + h * (D + 2);
                if (part[1] == 0.0f) continue;
                const float w = exp_poly(part[0] - top);
                total += w * part[1];
                for (int64_t d = 0; d < D; d++) o[d] += w * part[2 + d];
            }
            const float inv = 1.0f / total;
            for (int64_t d = 0; d < D; d++) o[d] *= inv;
        }
}

int ninfer_decode_attention(const float *q, float *out, const void *k_cache, const void *v_cache,
                            const uint16_t *k_scale, const uint16_t *v_scale, const int32_t *block_table,
                            const int32_t *seq_lens, const int32_t *cu, int64_t T, int64_t B, int64_t max_blocks,
                            int64_t block_size, int64_t Hq, int64_t Hk, int64_t D, int64_t num_blocks, int64_t mode,
                            float scale) {
    if (cu[0] < 0 || cu[B] > T || mode < KV_FP32 || mode > KV_K8V4 || (mode == KV_K8V4 && D % V4_GROUP)) return -2;
    for (int64_t b = 0; b < B; b++) {
        const int64_t q_len = cu[b + 1] - cu[b], len = seq_lens[b];
        if (q_len < 0 || len < q_len || (len + block_size - 1) / block_size > max_blocks) return -2;
        for (int64_t p = 0; p < (len + block_size - 1) / block_size; p++)
            if (block_table[b * max_blocks + p] < 0 || block_table[b * max_blocks + p] >= num_blocks)
                return -2;
    }
    /* parts of part_pages pages each; a sequence of one part writes out directly, others merge after */
    const int64_t part_pages = PART_KEYS / block_size > 1 ? PART_KEYS / block_size : 1, part_keys = part_pages * block_size;
    int64_t *first = (int64_t *)scratch_slot(1, (size_t)(2 * B + 1) * sizeof(int64_t));
    if (!first) return -1;
    int64_t *offset = first + B + 1, partials = 0;
    first[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t parts = seq_lens[b] > 0 ? (seq_lens[b] + part_keys - 1) / part_keys : 1;
        first[b + 1] = first[b] + parts;
        offset[b] = partials;
        if (parts > 1) partials += parts * (cu[b + 1] - cu[b]);
    }
    float *partial = NULL;
    if (partials > 0) {
        partial = (float *)malloc((size_t)(partials * Hq * (D + 2)) * sizeof(float));
        if (!partial) return -1;
    }
    attention_job job = {q, k_cache, v_cache, k_scale, v_scale, (int)mode, out, block_table, seq_lens, cu,
                         max_blocks, block_size, Hq, Hk, D, scale, part_pages, first, offset, partial, 0};
    /* one part runs on the caller; several are shared out (kernels/native_pool.c) */
    pool_run(attend, &job, first[B], 1);
    if (!job.failed)
        for (int64_t b = 0; b < B; b++)
            if (first[b + 1] - first[b] > 1) merge_parts(&job, b);
    free(partial);
    return job.failed ? -1 : 0;
}
