"""Group-wise quantized matmul (naive.py, triton.py; dequant.py: long prefill chunks through cuBLAS).

MIN_GROUP: the smallest group each width's fused kernel takes (every tl.dot needs K >= 16: a 4-bit product
spans half a group, a 6-bit one a quarter); the loader dequantizes narrower groups.
DEQUANT_MIN_M: from this many rows of x on, the Triton path dequantizes the weight into a scratch buffer a
slice at a time and multiplies with cuBLAS (dequant.py) instead of the fused GEMM.
DEQUANT_SCRATCH_BYTES: that buffer, one per device and dtype (a row of the memory ledger)."""

MIN_GROUP = {4: 32, 6: 64, 8: 16}
DEQUANT_MIN_M = 256
DEQUANT_SCRATCH_BYTES = 64 << 20
