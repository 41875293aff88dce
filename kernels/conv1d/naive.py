import torch


def causal_conv1d(
    x: torch.Tensor,  # [T, C]; the new tokens of all sequences, packed
    weight: torch.Tensor,  # [C, K] depthwise kernel
    conv_state: torch.Tensor,  # [num_slots, C, K - 1]; the last K - 1 inputs of each sequence (in place)
    cu_seqlens: torch.Tensor,  # [B + 1] int32
    state_indices: torch.Tensor,  # [B] int32; slot of each sequence in conv_state
    apply_silu: bool = True,
) -> torch.Tensor:
    """Depthwise causal conv1d over each sequence, continuing from (and updating) its conv state.

    A new sequence's slot must be zeroed beforehand (the state pool does this at admission). A sequence
    whose slot is -1 is padding (a CUDA-graph row past the batch): its outputs are zero and no state is
    read or written.
    """
    kernel = weight.shape[1]
    out = torch.empty_like(x)
    cu = cu_seqlens.tolist()
    for b, slot in enumerate(state_indices.tolist()):
        start, end = cu[b], cu[b + 1]
        if end == start:
            continue
        if slot < 0:
            out[start:end] = 0
            continue
        xb = torch.cat([conv_state[slot].to(x.dtype), x[start:end].t()], dim=-1)  # [C, K - 1 + L]
        conv_state[slot] = xb[:, -(kernel - 1) :].to(conv_state.dtype)
        y = torch.nn.functional.conv1d(
            xb.unsqueeze(0).float(), weight.float().unsqueeze(1), groups=x.shape[1]
        )
        y = y[0].t()  # [L, C]
        if apply_silu:
            y = torch.nn.functional.silu(y)
        out[start:end] = y.to(x.dtype)
    return out
