import torch


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule(
    q: torch.Tensor,  # [T, Hk, Dk]
    k: torch.Tensor,  # [T, Hk, Dk]
    v: torch.Tensor,  # [T, Hv, Dv]; Hv is a multiple of Hk
    g: torch.Tensor,  # [T, Hv] fp32 log-decay (<= 0)
    beta: torch.Tensor,  # [T, Hv]
    state: torch.Tensor,  # [num_slots, Hv, Dk, Dv] fp32 recurrent state (in place)
    cu_seqlens: torch.Tensor,  # [B + 1] int32
    state_indices: torch.Tensor,  # [B] int32
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """Gated delta rule, token by token (the recurrent form), for variable-length packed sequences.

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - S^T k_t))^T ;  o_t = S_t^T q_t / sqrt(Dk).
    Returns o: [T, Hv, Dv] in v's dtype; each sequence's final state is written back to its slot. A
    sequence whose slot is -1 is padding: its outputs are zero and no state is read or written.
    """
    num_v_heads, head_k_dim = v.shape[1], q.shape[2]
    rep = num_v_heads // q.shape[1]
    qf = q.float().repeat_interleave(rep, dim=1)
    kf = k.float().repeat_interleave(rep, dim=1)
    if use_qk_l2norm:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf = qf * head_k_dim**-0.5
    vf, gf, bf = v.float(), g.float(), beta.float()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    cu = cu_seqlens.tolist()
    for b, slot in enumerate(state_indices.tolist()):
        if slot < 0:
            out[cu[b] : cu[b + 1]] = 0
            continue
        s = state[slot].float()  # [Hv, Dk, Dv]
        for t in range(cu[b], cu[b + 1]):
            s = s * gf[t].exp()[:, None, None]
            kv_mem = torch.einsum("hkv,hk->hv", s, kf[t])
            delta = (vf[t] - kv_mem) * bf[t][:, None]
            s = s + kf[t][:, :, None] * delta[:, None, :]
            out[t] = torch.einsum("hkv,hk->hv", s, qf[t])
        state[slot] = s.to(state.dtype)
    return out.to(v.dtype)
