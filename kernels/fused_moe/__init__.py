"""Mixture-of-experts MLP (Qwen3-MoE): the router's top-k choice per token (moe_route) and the chosen
experts' gated MLPs, weighted and summed (fused_moe). Only the naive twin exists so far: it runs on every
device, grouping tokens by expert (a host sync for the group sizes, so decode steps of a MoE model run
without CUDA graphs); a Triton kernel over packed experts is planned."""
