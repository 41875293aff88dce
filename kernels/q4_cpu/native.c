/* int4 weight x int8 activation matmul for x86 CPUs with AVX-512 VNNI (ninfer's CPU decode path).

   y[M, N] = x[M, K] W^T with W held 4-bit in groups of GROUP input columns: w = d * q + m, q in [0, 15],
   d and m fp16 per (row, group). Activations are quantized per row and group as two int8 terms,
   x ~ d1 * (q1 + q2 / 254): q1 = round(x / d1) with d1 = max|x| / 127, q2 the rounding residual on a grid
   254x finer (~15 bits in all). The dot products run on VPDPBUSD (u8 x s8 -> s32, 64 products an
   instruction); per group: y += d * d1 * (254 * S1 + S2) / 254 + m * sum(x).

   Weight layout (`pack` in native.py): blocks of ROWS output rows; per (block, group) BLOCK_BYTES bytes:
   4 x 64 bytes of codes, then ROWS fp16 d, then ROWS fp16 m. Code byte i of 64-byte vector t (t < 4)
   holds, in its low nibble, step t and in its high nibble step t + 4, where step s, byte i = 4 r + j is
   row r, column 4 s + j of the group: one VPDPBUSD per step, each of the 16 lanes one row.

   One row (decode of one sequence) runs on the calling thread alone: one core already streams the weights
   as fast as this machine's memory delivers them (measured; a second thread added nothing). From two rows
   on, the dot products are the bound and the pool of kernels/native_pool.c shares the row blocks.

   ninfer_q4_dequantize_t_bf16 unpacks the weight for prefill's bf16 GEMM, transposed: Wt [K, N] bf16, so
   the 16 lanes of one code vector (16 output rows, one column) land as 16 consecutive bf16 values. */

#include <stdint.h>
#include <stdlib.h>

#include "../native_math.h"

#define ROWS 16
#define GROUP 32
#define BLOCK_BYTES 320
#define M_TILE 8 /* activation rows sharing one unpacking of a group's codes (8 of the 32 registers) */
#define ABI_VERSION 1
#define CHUNK_BLOCKS 4    /* row blocks a thread takes at a time */
#define HELPER_MIN_ROWS 2 /* activation rows from which the helper thread joins */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>

int ninfer_q4_abi(void) { return ABI_VERSION; }

/* x [K] -> q1, q2 [K] int8; per group: scale = d1 / 254 and sum(x) */
static void quantize_row(const float *x, int64_t K, int8_t *q1, int8_t *q2, float *scale, float *xsum) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *p = x + g * GROUP;
        __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        float d1 = amax / 127.0f;
        float inv1 = d1 > 0.0f ? 1.0f / d1 : 0.0f;
        __m512 vd1 = _mm512_set1_ps(d1), vi1 = _mm512_set1_ps(inv1), vi2 = _mm512_set1_ps(inv1 * 254.0f);
        __m512 ra = _mm512_roundscale_ps(_mm512_mul_ps(a, vi1), _MM_FROUND_TO_NEAREST_INT);
        __m512 rb = _mm512_roundscale_ps(_mm512_mul_ps(b, vi1), _MM_FROUND_TO_NEAREST_INT);
        __m512 sa = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(a, _mm512_mul_ps(ra, vd1)), vi2),
                                         _MM_FROUND_TO_NEAREST_INT);
        __m512 sb = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(b, _mm512_mul_ps(rb, vd1)), vi2),
                                         _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(q1 + g * GROUP), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(ra)));
        _mm_storeu_si128((__m128i *)(q1 + g * GROUP + 16), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(rb)));
        _mm_storeu_si128((__m128i *)(q2 + g * GROUP), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(sa)));
        _mm_storeu_si128((__m128i *)(q2 + g * GROUP + 16), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(sb)));
        scale[g] = d1 / 254.0f;
        xsum[g] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    }
}

/* one block of ROWS output rows for MT activation rows: each group's codes are unpacked once into eight
   registers and used by every row of the tile; MT is a constant at each call site, so the accumulators
   stay in registers */
static inline __attribute__((always_inline)) void block_tile(const uint8_t *wb, const int8_t *q1,
                                                             const int8_t *q2, const float *scale,
                                                             const float *xsum, float *y, int64_t G,
                                                             int64_t K, int64_t N, const int MT) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512 acc[M_TILE];
    for (int i = 0; i < MT; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *blk = wb + g * BLOCK_BYTES;
        __m512i lo[4], hi[4];
        for (int t = 0; t < 4; t++) {
            __m512i p = _mm512_loadu_si512(blk + 64 * t);
            lo[t] = _mm512_and_si512(p, nibble);
            hi[t] = _mm512_and_si512(_mm512_srli_epi16(p, 4), nibble);
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 4 * 64)));
        __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 4 * 64 + 2 * ROWS)));
        for (int i = 0; i < MT; i++) {
            const int32_t *a1 = (const int32_t *)(q1 + i * K + g * GROUP);
            const int32_t *a2 = (const int32_t *)(q2 + i * K + g * GROUP);
            /* four independent chains: steps t and t + 4 of each term; step s reads columns 4s..4s+3 */
            __m512i s1 = _mm512_setzero_si512(), t1 = _mm512_setzero_si512();
            __m512i s2 = _mm512_setzero_si512(), t2 = _mm512_setzero_si512();
            for (int t = 0; t < 4; t++) {
                s1 = _mm512_dpbusd_epi32(s1, lo[t], _mm512_set1_epi32(a1[t]));
                t1 = _mm512_dpbusd_epi32(t1, hi[t], _mm512_set1_epi32(a1[t + 4]));
                s2 = _mm512_dpbusd_epi32(s2, lo[t], _mm512_set1_epi32(a2[t]));
                t2 = _mm512_dpbusd_epi32(t2, hi[t], _mm512_set1_epi32(a2[t + 4]));
            }
            /* 254 * S1 + S2, with 254 x = 256 x - 2 x; |254 S1| <= 254 * 15 * 127 * 32 fits int32 */
            __m512i c1 = _mm512_add_epi32(s1, t1);
            __m512i c = _mm512_sub_epi32(_mm512_slli_epi32(c1, 8), _mm512_slli_epi32(c1, 1));
            c = _mm512_add_epi32(c, _mm512_add_epi32(s2, t2));
            __m512 ds = _mm512_mul_ps(d, _mm512_set1_ps(scale[i * G + g]));
            acc[i] = _mm512_fmadd_ps(ds, _mm512_cvtepi32_ps(c), acc[i]);
            acc[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xsum[i * G + g]), acc[i]);
        }
    }
    for (int i = 0; i < MT; i++) _mm512_storeu_ps(y + i * N, acc[i]);
}

/* The arguments of one call, shared with the helper thread. */
typedef struct {
    const uint8_t *w;
    const int8_t *q1, *q2;
    const float *scale, *xsum;
    float *y;
    int64_t M, N, K, G;
} job_t;

static void run_block(const job_t *j, int64_t b) {
    /* row blocks outer: a block's codes come from memory once, and from L1 for the later row tiles */
    const uint8_t *wb = j->w + b * j->G * BLOCK_BYTES;
    const int64_t G = j->G, K = j->K, N = j->N;
    for (int64_t m = 0; m < j->M; m += M_TILE) {
        const int8_t *a1 = j->q1 + m * K, *a2 = j->q2 + m * K;
        const float *sc = j->scale + m * G, *xs = j->xsum + m * G;
        float *out = j->y + m * N + b * ROWS;
        switch (j->M - m < M_TILE ? j->M - m : M_TILE) {
        case 1: block_tile(wb, a1, a2, sc, xs, out, G, K, N, 1); break;
        case 2: block_tile(wb, a1, a2, sc, xs, out, G, K, N, 2); break;
        case 3: block_tile(wb, a1, a2, sc, xs, out, G, K, N, 3); break;
        case 4: block_tile(wb, a1, a2, sc, xs, out, G, K, N, 4); break;
        case 5: block_tile(wb, a1, a2, sc, xs, out, G, K, N, 5); break;
        case 6: block_tile(wb, a1, a2, sc, xs, out, G, K, N, 6); break;
        case 7: block_tile(wb, a1, a2, sc, xs, out, G, K, N, 7); break;
        default: block_tile(wb, a1, a2, sc, xs, out, G, K, N, 8); break;
        }
    }
}

static void run_blocks(void *ctx, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) run_block((const job_t *)ctx, b);
}

typedef struct {
    const uint8_t *w;
    uint16_t *wt;
    int64_t N, K;
} unpack_job;

/* fp32 -> bf16 bits, rounded to nearest even (as torch converts; the weights hold no NaN) */
static inline __m256i to_bf16(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

/* row blocks [b0, b1): w = d * q + m, exact in fp32 (q < 16 times an 11-bit d), then rounded to bf16 */
static void unpack_blocks(void *ctx, int64_t b0, int64_t b1) {
    const unpack_job *j = (const unpack_job *)ctx;
    const int64_t G = j->K / GROUP;
    const __m512i low_nibbles = _mm512_set1_epi8(0x0F), byte = _mm512_set1_epi32(0xFF);
    for (int64_t b = b0; b < b1; b++)
        for (int64_t g = 0; g < G; g++) {
            const uint8_t *blk = j->w + (b * G + g) * BLOCK_BYTES;
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 4 * 64)));
            const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 4 * 64 + 2 * ROWS)));
            uint16_t *col = j->wt + g * GROUP * j->N + b * ROWS; /* Wt[g * GROUP + c, b * ROWS + r] */
            for (int s = 0; s < 4; s++) {
                const __m512i v = _mm512_loadu_si512((const void *)(blk + s * 64));
                const __m512i steps[2] = {_mm512_and_si512(v, low_nibbles),
                                          _mm512_and_si512(_mm512_srli_epi16(v, 4), low_nibbles)};
                for (int half = 0; half < 2; half++) /* step s, then step s + 4 */
                    for (int c = 0; c < 4; c++) {     /* byte c of each lane: column 4 * step + c */
                        const __m512i q = _mm512_and_si512(_mm512_srli_epi32(steps[half], 8 * c), byte);
                        const __m512 w = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), d, m);
                        _mm256_storeu_si256((__m256i *)(col + (4 * (s + 4 * half) + c) * j->N), to_bf16(w));
                    }
            }
        }
}

/* Wt [K, N] bf16 from the packed weight [N / ROWS, K / GROUP, BLOCK_BYTES]; returns 0 */
int ninfer_q4_dequantize_t_bf16(const uint8_t *w, uint16_t *wt, int64_t N, int64_t K) {
    unpack_job job = {.w = w, .wt = wt, .N = N, .K = K};
    pool_run(unpack_blocks, &job, N / ROWS, CHUNK_BLOCKS);
    return 0;
}

/* returns 0, or -1 when the scratch could not be allocated (y untouched) */
int ninfer_q4_matmul(const uint8_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K) {
    const int64_t G = K / GROUP, NB = N / ROWS;
    int8_t *q = (int8_t *)scratch_bytes((size_t)M * K * 2 + (size_t)M * G * 2 * sizeof(float));
    if (!q) return -1;
    int8_t *q1 = q, *q2 = q + M * K;
    float *scale = (float *)(q + 2 * M * K), *xsum = scale + M * G;
    for (int64_t m = 0; m < M; m++)
        quantize_row(x + m * K, K, q1 + m * K, q2 + m * K, scale + m * G, xsum + m * G);

    job_t job = {.w = w, .q1 = q1, .q2 = q2, .scale = scale, .xsum = xsum, .y = y, .M = M, .N = N, .K = K, .G = G};
    /* one row streams the weights as fast as memory delivers them: the helper joins from two rows on */
    if (M < HELPER_MIN_ROWS)
        run_blocks(&job, 0, NB);
    else
        pool_run(run_blocks, &job, NB, CHUNK_BLOCKS);
    return 0;
}

#else
/* built without the instructions: the loader sees ABI 0 and keeps torch's int4 kernel */
int ninfer_q4_abi(void) { return 0; }
int ninfer_q4_matmul(const uint8_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K) {
    (void)w; (void)x; (void)y; (void)M; (void)N; (void)K;
    return -2;
}
int ninfer_q4_dequantize_t_bf16(const uint8_t *w, uint16_t *wt, int64_t N, int64_t K) {
    (void)w; (void)wt; (void)N; (void)K;
    return -2;
}
#endif
