"""Mixture-of-experts MLP (Qwen3-MoE): the router's top-k choice per token (moe_route, torch on every
device) and the chosen experts' gated MLPs, weighted and summed (fused_moe: naive.py groups tokens by
expert with a host sync; triton.py sorts the assignments by expert on the device and runs a grouped matmul
over dense or packed 4/6/8-bit experts, so CUDA decode steps can be captured as graphs)."""
