"""Group-wise quantized matmul (naive.py, triton.py). MIN_GROUP: the smallest group each width's fused
kernel takes (every tl.dot needs K >= 16: a 4-bit product spans half a group, a 6-bit one a quarter); the
loader dequantizes narrower groups."""

MIN_GROUP = {4: 32, 6: 64, 8: 16}
