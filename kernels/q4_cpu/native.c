/* int4 weight x int8 activation matmul for x86 CPUs (ninfer's CPU decode path): AVX-512 VNNI, or AVX2
   (with FMA and F16C) where the CPU has no AVX-512 — the same layout and the same integer sums, so the
   same result up to the order of a few float sums.

   y[M, N] = x[M, K] W^T with W held 4-bit in groups of GROUP input columns: w = d * q + m, q in [0, 15],
   d and m fp16 per (row, group). Activations are quantized per row and group as two int8 terms,
   x ~ d1 * (q1 + q2 / 254): q1 = round(x / d1) with d1 = max|x| / 127, q2 the rounding residual on a grid
   254x finer (~15 bits in all). The dot products run on VPDPBUSD (u8 x s8 -> s32, 64 products an
   instruction; on AVX2, VPMADDUBSW then VPMADDWD give the same four-product sums, 32 at a time);
   per group: y += d * d1 * (254 * S1 + S2) / 254 + m * sum(x).

   Weight layout (`pack` in native.py): blocks of ROWS output rows; per (block, group) BLOCK_BYTES bytes:
   4 x 64 bytes of codes, then ROWS fp16 d, then ROWS fp16 m. Code byte i of 64-byte vector t (t < 4)
   holds, in its low nibble, step t and in its high nibble step t + 4, where step s, byte i = 4 r + j is
   row r, column 4 s + j of the group: one VPDPBUSD per step, each of the 16 lanes one row (on AVX2, each
   32-byte half of the vector: 8 rows).

   Each output row is computed the same way whatever the number of activation rows (M tiles share only the
   unpacking of the codes), so a sequence decodes to the same values alone or in a batch.

   With AVX-512 VNNI one row (decode of one sequence) runs on the calling thread alone: one core already
   streams the weights as fast as this machine's memory delivers them (measured; a second thread added
   nothing), and from two rows on, the dot products are the bound and the pool of kernels/native_pool.c
   shares the row blocks. With AVX2 (three instructions where VNNI has one) one core's dot products fall
   behind memory already at one row: the pool shares the row blocks from one row on (measured on a 2-core
   AVX2 VM: the embedded model's decode 53 -> 65 tok/s).

   ninfer_q4_dequantize_t_bf16 unpacks the weight for prefill's bf16 GEMM, transposed: Wt [K, N] bf16, so
   the lanes of one code vector (output rows, one column) land as consecutive bf16 values. */

#include <stdint.h>
#include <stdlib.h>

#include "../native_math.h"

#define ROWS 16
#define GROUP 32
#define BLOCK_BYTES 320
#define M_TILE 8 /* activation rows sharing one unpacking of a group's codes (8 of the 32 registers) */
#define ABI_VERSION 1
#define CHUNK_BLOCKS 4    /* row blocks a thread takes at a time */

/* The arguments of one matmul call, shared with the pool's threads. */
typedef struct {
    const uint8_t *w;
    const int8_t *q1, *q2;
    const float *scale, *xsum;
    float *y;
    int64_t M, N, K, G;
} job_t;

typedef struct {
    const uint8_t *w;
    uint16_t *wt;
    int64_t N, K;
} unpack_job;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define Q4_SIMD 512

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

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define Q4_SIMD 256

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float hsum8(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

/* 32 int32 values in four vectors (each within -127..127) -> 32 int8, in order */
static inline void store_i8x32(int8_t *out, __m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    /* the packs work within 128-bit lanes: dword k of the result holds values 4 (k / 4) .. 4 (k / 4) + 3
       of vector k % 4; gather them back in order */
    _mm256_storeu_si256((__m256i *)out,
                        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* x [K] -> q1, q2 [K] int8; per group: scale = d1 / 254 and sum(x) */
static void quantize_row(const float *x, int64_t K, int8_t *q1, int8_t *q2, float *scale, float *xsum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *p = x + g * GROUP;
        __m256 v[4], r[4], e[4];
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(p + 8 * k);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
        }
        float d1 = hmax8(amax) / 127.0f;
        float inv1 = d1 > 0.0f ? 1.0f / d1 : 0.0f;
        __m256 vd1 = _mm256_set1_ps(d1), vi1 = _mm256_set1_ps(inv1), vi2 = _mm256_set1_ps(inv1 * 254.0f);
        for (int k = 0; k < 4; k++) {
            r[k] = _mm256_round_ps(_mm256_mul_ps(v[k], vi1), nearest);
            e[k] = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(v[k], _mm256_mul_ps(r[k], vd1)), vi2), nearest);
        }
        store_i8x32(q1 + g * GROUP, _mm256_cvtps_epi32(r[0]), _mm256_cvtps_epi32(r[1]), _mm256_cvtps_epi32(r[2]),
                    _mm256_cvtps_epi32(r[3]));
        store_i8x32(q2 + g * GROUP, _mm256_cvtps_epi32(e[0]), _mm256_cvtps_epi32(e[1]), _mm256_cvtps_epi32(e[2]),
                    _mm256_cvtps_epi32(e[3]));
        scale[g] = d1 / 254.0f;
        xsum[g] = hsum8(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
    }
}

/* VPDPBUSD's sums on AVX2: VPMADDUBSW gives each 16-bit lane the sum of two u8 x s8 products (|each| <=
   2 * 15 * 127 = 3810), the eight steps of a group are added in 16 bits (|sum| <= 30480: no overflow),
   and one VPMADDWD by ones gives each 32-bit lane its four-product sums over the group, as VPDPBUSD's
   would be: 16 + 14 + 2 instructions a row and group where one VPDPBUSD emulation a step took 48 */
static inline __m256i group_dot(const __m256i lo[4], const __m256i hi[4], const int32_t *a) {
    __m256i sum = _mm256_maddubs_epi16(lo[0], _mm256_set1_epi32(a[0]));
    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(hi[0], _mm256_set1_epi32(a[4])));
    for (int t = 1; t < 4; t++) {
        sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(lo[t], _mm256_set1_epi32(a[t])));
        sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(hi[t], _mm256_set1_epi32(a[t + 4])));
    }
    return _mm256_madd_epi16(sum, _mm256_set1_epi16(1));
}

/* as the AVX-512 block_tile, one 8-row half of the block at a time (16 registers: the codes of a group
   take 8 of them, the tile's accumulators the rest) */
static inline __attribute__((always_inline)) void block_tile(const uint8_t *wb, const int8_t *q1,
                                                             const int8_t *q2, const float *scale,
                                                             const float *xsum, float *y, int64_t G,
                                                             int64_t K, int64_t N, const int MT) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (int half = 0; half < 2; half++) {
        __m256 acc[M_TILE];
        for (int i = 0; i < MT; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t g = 0; g < G; g++) {
            const uint8_t *blk = wb + g * BLOCK_BYTES;
            __m256i lo[4], hi[4];
            for (int t = 0; t < 4; t++) {
                __m256i p = _mm256_loadu_si256((const __m256i *)(blk + 64 * t + 32 * half));
                lo[t] = _mm256_and_si256(p, nibble);
                hi[t] = _mm256_and_si256(_mm256_srli_epi16(p, 4), nibble);
            }
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 4 * 64 + 16 * half)));
            __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 4 * 64 + 2 * ROWS + 16 * half)));
            for (int i = 0; i < MT; i++) {
                const int32_t *a1 = (const int32_t *)(q1 + i * K + g * GROUP);
                const int32_t *a2 = (const int32_t *)(q2 + i * K + g * GROUP);
                __m256i c1 = group_dot(lo, hi, a1);
                __m256i c = _mm256_sub_epi32(_mm256_slli_epi32(c1, 8), _mm256_slli_epi32(c1, 1));
                c = _mm256_add_epi32(c, group_dot(lo, hi, a2));
                __m256 ds = _mm256_mul_ps(d, _mm256_set1_ps(scale[i * G + g]));
                acc[i] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(c), acc[i]);
                acc[i] = _mm256_fmadd_ps(mn, _mm256_set1_ps(xsum[i * G + g]), acc[i]);
            }
        }
        for (int i = 0; i < MT; i++) _mm256_storeu_ps(y + i * N + 8 * half, acc[i]);
    }
}

/* fp32 -> bf16 bits, rounded to nearest even (as torch converts; the weights hold no NaN) */
static inline __m128i to_bf16(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
    const __m256i high = _mm256_srli_epi32(rounded, 16); /* 0..0xFFFF: packus keeps it */
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0x08);
    return _mm256_castsi256_si128(packed);
}

/* row blocks [b0, b1), as the AVX-512 unpack_blocks, 8 rows at a time */
static void unpack_blocks(void *ctx, int64_t b0, int64_t b1) {
    const unpack_job *j = (const unpack_job *)ctx;
    const int64_t G = j->K / GROUP;
    const __m256i low_nibbles = _mm256_set1_epi8(0x0F), byte = _mm256_set1_epi32(0xFF);
    for (int64_t b = b0; b < b1; b++)
        for (int64_t g = 0; g < G; g++) {
            const uint8_t *blk = j->w + (b * G + g) * BLOCK_BYTES;
            for (int h = 0; h < 2; h++) { /* rows 8h..8h+7 */
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 4 * 64 + 16 * h)));
                const __m256 m =
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 4 * 64 + 2 * ROWS + 16 * h)));
                uint16_t *col = j->wt + g * GROUP * j->N + b * ROWS + 8 * h;
                for (int s = 0; s < 4; s++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + s * 64 + 32 * h));
                    const __m256i steps[2] = {_mm256_and_si256(v, low_nibbles),
                                              _mm256_and_si256(_mm256_srli_epi16(v, 4), low_nibbles)};
                    for (int half = 0; half < 2; half++)
                        for (int c = 0; c < 4; c++) {
                            const __m256i q = _mm256_and_si256(_mm256_srli_epi32(steps[half], 8 * c), byte);
                            const __m256 w = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d, m);
                            _mm_storeu_si128((__m128i *)(col + (4 * (s + 4 * half) + c) * j->N), to_bf16(w));
                        }
                }
            }
        }
}
#endif

#ifdef Q4_SIMD
/* activation rows from which the helper thread joins (see the top) */
#if Q4_SIMD == 512
#define HELPER_MIN_ROWS 2
#else
#define HELPER_MIN_ROWS 1
#endif

int ninfer_q4_abi(void) { return ABI_VERSION; }

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
    /* with VNNI one row streams the weights as fast as memory delivers them: the helper joins from two rows on */
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
