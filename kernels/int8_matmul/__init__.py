"""Group-wise quantized weights (kernels/quant_matmul's layout) times int8 activations (kernels/int8_act):
the int8 tensor-core path for prefill-sized matmuls.

MIN_GROUP: the narrowest weight group the kernel takes (a group is one tl.dot's K, which int8 tensor-core
products need at 32 or more)."""

MIN_GROUP = 32
