/* Store a step's K and V rows into an fp32 paged cache (the naive twin: kernels/kv_store/naive.py).

   k / v [T, Hk * D] rows sk / sv floats apart (views into the fused qkv output); the caches are
   [num_slots, Hk * D] (pages of block_size slots, flattened). slots[t] < 0: token t has no slot (padding).
   Returns 0, or -2 when a slot is past the cache (nothing written). */

#include <stdint.h>
#include <string.h>

int ninfer_kv_store(const float *k, const float *v, float *k_cache, float *v_cache, const int64_t *slots,
                    int64_t T, int64_t sk, int64_t sv, int64_t row, int64_t num_slots) {
    for (int64_t t = 0; t < T; t++)
        if (slots[t] >= num_slots) return -2;
    for (int64_t t = 0; t < T; t++) {
        if (slots[t] < 0) continue;
        memcpy(k_cache + slots[t] * row, k + t * sk, (size_t)row * sizeof(float));
        memcpy(v_cache + slots[t] * row, v + t * sv, (size_t)row * sizeof(float));
    }
    return 0;
}
