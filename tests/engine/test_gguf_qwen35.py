"""Qwen3.5 GGUF files: a tiny transformers model written the way llama.cpp's converter writes one (renamed
tensors, 1 + w norms, -exp(A_log), squeezed conv1d, value heads in tiled order, an MTP block) loads back
as the checkpoint and generates transformers' greedy tokens; `ninfer convert` reads it."""

from __future__ import annotations

import gguf
import pytest
import torch
from conftest import hf_greedy_reference, mtp_head_tensors, save_mtp_head, save_tiny, tiny_hf_model
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from engine import LLM, NinferError, SamplingParams
from engine.formats.gguf import _pre_tokenizer, load_gguf
from engine.quant.convert import convert
from engine.quant.groupwise import dequantize
from engine.quant.layer import holds_packed_weights

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
Q = gguf.GGMLQuantizationType

PROMPT = [4, 80, 19, 300, 2, 45, 46, 7, 99]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
INTERVAL = 2  # every second layer full attention (llama.cpp's layout is an interval, not a list)


@pytest.fixture(scope="module")
def model():
    # 2 key heads, 4 value heads: the converter's tiled value-head order differs from the checkpoint's
    layer_types = ["linear_attention", "full_attention"] * 2
    return tiny_hf_model("qwen3_5", tied=False, layer_types=layer_types)


def _tiled(t: torch.Tensor, dim: int, num_k: int, per_k: int, head_dim: int) -> torch.Tensor:
    """The converter's reorder: value head j of key head i moves from i * per_k + j to j * num_k + i."""
    shape = list(t.shape)
    t = t.reshape(*shape[:dim], num_k, per_k, head_dim, *shape[dim + 1 :])
    return t.transpose(dim, dim + 1).reshape(shape)


def _as_converted(name: str, t: torch.Tensor, cfg) -> tuple[str, torch.Tensor]:
    """(HF name, tensor) as llama.cpp's Qwen3.5 converter stores it (name still HF-style)."""
    num_k, num_v = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    per_k, head_v = num_v // num_k, cfg.linear_value_head_dim
    key_rows = 2 * num_k * cfg.linear_key_head_dim
    if ".linear_attn." in name:
        if "in_proj_qkv" in name:
            t = torch.cat([t[:key_rows], _tiled(t[key_rows:], 0, num_k, per_k, head_v)])
        elif "in_proj_z" in name:
            t = _tiled(t, 0, num_k, per_k, head_v)
        elif "in_proj_b" in name or "in_proj_a" in name:
            t = _tiled(t, 0, num_k, per_k, 1)
        elif name.endswith(("A_log", "dt_bias")):
            t = _tiled(t.unsqueeze(-1), 0, num_k, per_k, 1).squeeze(-1)
        elif "conv1d" in name:
            t = t.squeeze()
            t = torch.cat([t[:key_rows], _tiled(t[key_rows:], 0, num_k, per_k, head_v)])
        elif "out_proj" in name:
            t = _tiled(t, 1, num_k, per_k, head_v)
    if name.endswith("A_log"):
        t = -torch.exp(t)
    elif name.endswith("dt_bias"):
        name = name.replace("dt_bias", "dt_proj.bias")
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        t = t + 1
    return name, t


def write_qwen35_gguf(
    model,
    path,
    mtp_head: dict | None = None,
    qtype: gguf.GGMLQuantizationType | None = None,
    keep_float: tuple = (),
    sections: tuple[int, ...] = (11, 11, 10, 0),
    tokens: list[str] | None = None,
):
    """A GGUF of `model` with the keys and tensors llama.cpp's converter writes for Qwen3.5; with `qtype`,
    the matrices as its blocks (norms, conv1d, A_log and dt_bias stay F32, as llama.cpp keeps them, and so
    do matrices whose name holds one of `keep_float`). `mtp_head` (mtp.* tensors): written as the converter
    writes an MTP head, a block after the text layers. `sections`: the M-RoPE sections the converter
    writes; `tokens`: a vocabulary list (no tokenizer model: the GGUF gives token ids only)."""
    cfg = model.config
    mtp_layers = 1 if mtp_head else 0
    blocks = cfg.num_hidden_layers + mtp_layers
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35, blocks)
    w = gguf_writer(path, "qwen35", cfg, blocks)
    add_hybrid_keys(w, cfg)
    w.add_rope_dimension_sections(list(sections))
    if tokens is not None:
        w.add_token_list(tokens)
    if mtp_layers:
        w.add_nextn_predict_layers(mtp_layers)
    bid = cfg.num_hidden_layers
    tensors = {**model.state_dict(), **mtp_block(mtp_head or {}, bid)}
    for hf_name, t in tensors.items():
        hf_name, t = _as_converted(hf_name, t.float(), cfg)
        name = gguf_name(names, hf_name, bid)
        if (
            qtype is not None
            and t.dim() == 2
            and "conv1d" not in hf_name
            and not any(f in hf_name for f in keep_float)
        ):
            w.add_tensor(name, gguf.quants.quantize(t.numpy(), qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t.numpy())
    return close_gguf(w, path)


# the converter's renames of an MTP head's own tensors, in the block after the text layers
_NEXTN = {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head.norm",
}


def mtp_block(mtp_head: dict, bid: int) -> dict:
    """mtp.* tensors named as the block `bid` the converter writes them as (HF-style names)."""
    out = {}
    for name, t in mtp_head.items():
        part = name.split(".")[1]
        if part == "layers":
            out[name.replace("mtp.layers.0.", f"model.layers.{bid}.")] = t
        else:
            out[f"model.layers.{bid}.{_NEXTN[part]}.weight"] = t
    return out


def gguf_name(names, hf_name: str, bid: int) -> str | None:
    """A tensor's GGUF name; the MTP block's own tensors as `nextn` (an arch's map may lack them)."""
    name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    part = hf_name.removeprefix(f"model.layers.{bid}.").removesuffix(".weight")
    if name is None and part in _NEXTN.values():
        name = f"blk.{bid}.nextn.{part.replace('.', '_')}.weight"
    return name


def gguf_writer(path, arch: str, cfg, blocks: int) -> gguf.GGUFWriter:
    """A writer with the keys every llama.cpp text architecture has, from a transformers config."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(blocks)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    return w


def add_hybrid_keys(w: gguf.GGUFWriter, cfg) -> None:
    """The Qwen3.5 layout's keys (Gated DeltaNet shapes, the full-attention interval, partial rotary)."""
    w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
    w.add_ssm_state_size(cfg.linear_key_head_dim)
    w.add_ssm_group_count(cfg.linear_num_key_heads)
    w.add_ssm_time_step_rank(cfg.linear_num_value_heads)
    w.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_num_value_heads)
    w.add_full_attention_interval(INTERVAL)
    w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]))


def close_gguf(w: gguf.GGUFWriter, path):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def mtp_head(model):
    return mtp_head_tensors(model)


@pytest.fixture(scope="module")
def qwen35_gguf(model, mtp_head, tmp_path_factory):
    return write_qwen35_gguf(model, tmp_path_factory.mktemp("q35gguf") / "tiny-qwen35.gguf", mtp_head)


def test_config_read_from_the_qwen35_keys(model, qwen35_gguf):
    config = load_gguf(qwen35_gguf).config
    assert config.architecture == "Qwen3_5ForCausalLM"
    assert config.num_hidden_layers == 4  # the MTP block is not a text layer
    assert config.layer_types == tuple(model.config.layer_types)
    assert config.partial_rotary_factor == 0.25
    assert (config.linear_num_key_heads, config.linear_num_value_heads) == (2, 4)
    assert (config.linear_key_head_dim, config.linear_value_head_dim, config.linear_conv_kernel_dim) == (
        16,
        16,
        4,
    )
    assert config.rope_theta == model.config.rope_parameters["rope_theta"]
    assert not config.tie_word_embeddings and config.mtp_num_hidden_layers == 1


def test_tensors_come_back_as_the_checkpoint_holds_them(model, mtp_head, qwen35_gguf):
    got = dict(load_gguf(qwen35_gguf).weights())
    want = {**model.state_dict(), **mtp_head}  # the MTP block's tensors back under mtp.*
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.allclose(got[name], tensor.float().reshape(got[name].shape), rtol=1e-5, atol=1e-6), name


def test_generates_transformers_greedy_tokens(model, qwen35_gguf):
    want, _ = hf_greedy_reference(model, PROMPT, GREEDY.max_tokens)
    got = LLM(qwen35_gguf).generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    assert got.token_ids == want


def test_mtp_head_of_a_gguf_drafts_as_the_checkpoints(model, mtp_head, qwen35_gguf, tmp_path):
    """The MTP block (nextn tensors, norms stored as 1 + w, the converter's tensor names) drafts the tokens
    the HF checkpoint's mtp.* head drafts."""
    hf_dir = save_mtp_head(save_tiny(model, tmp_path), mtp_head)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = [
        LLM(p, spec="mtp", draft_tokens=3).generate(prompt_token_ids=PROMPT, sampling_params=params)[0]
        for p in (hf_dir, qwen35_gguf)
    ]
    assert outs[0].token_ids == outs[1].token_ids
    assert outs[0].num_draft_tokens == outs[1].num_draft_tokens > 0
    assert outs[0].num_accepted_tokens == outs[1].num_accepted_tokens


def test_convert_reads_a_qwen35_gguf(qwen35_gguf, tmp_path):
    out = tmp_path / "tiny-qwen35.ninfer"
    convert(qwen35_gguf, out, "bf16")
    want = LLM(qwen35_gguf, dtype="bfloat16").generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    got = LLM(out, dtype="bfloat16").generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    assert got.token_ids == want.token_ids


@pytest.mark.parametrize(("head_v", "qtype"), [(32, Q.Q8_0), (32, Q.Q4_0), (16, Q.Q8_0)])
def test_block_quantized_matrices_stream_packed_with_the_dense_values(tmp_path, head_v, qtype):
    """Packed (rows and whole groups of columns moved back in place) or dense, the same weights; out_proj's
    value heads of 16 columns cut through 32-column groups, so there it streams dense."""
    layer_types = ["linear_attention", "full_attention"] * 2
    model = tiny_hf_model("qwen3_5", tied=False, layer_types=layer_types, linear_value_head_dim=head_v)
    src = load_gguf(write_qwen35_gguf(model, tmp_path / "q.gguf", qtype=qtype))
    dense = dict(src.weights())
    packed, rest = dict(src.quantized_weights()), dict(src.unquantized_weights())
    assert set(packed) | set(rest) == set(dense) and not set(packed) & set(rest)
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in packed and "model.norm.weight" in rest
    assert ("model.layers.0.linear_attn.out_proj.weight" in packed) == (head_v == 32)
    for name, qt in packed.items():
        assert torch.equal(dequantize(qt), dense[name]), name
    assert src.tensor_bits["model.layers.0.mlp.down_proj.weight"] == {Q.Q8_0: 8, Q.Q4_0: 4}[qtype]


def test_gpu_kernels_run_a_block_quantized_gguf_packed(tmp_path, kernel_backend):
    """The fused kernels (interpreted on CPU) on the GGUF's packed blocks give the dense load's tokens."""
    layer_types = ["linear_attention", "full_attention"] * 2
    model = tiny_hf_model("qwen3_5", tied=False, layer_types=layer_types, linear_value_head_dim=32)
    path = write_qwen35_gguf(model, tmp_path / "q8.gguf", qtype=Q.Q8_0)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=0)
    kernel_backend("naive")
    on_device = dict(weight_quant="none", device=DEVICE, dtype="float32")  # (a GPU's default: bf16)
    dense = LLM(path, **on_device).generate(prompt_token_ids=PROMPT, sampling_params=params)
    kernel_backend("triton")
    packed_llm = LLM(path, **on_device)
    assert holds_packed_weights(packed_llm.model)
    got = packed_llm.generate(prompt_token_ids=PROMPT, sampling_params=params)[0]
    assert got.token_ids == dense[0].token_ids
    for a, b in zip(got.logprobs, dense[0].logprobs):
        assert all(abs(a[t] - b[t]) < 1e-3 for t in b)


def test_float_parts_of_a_block_quantized_projection_pack_at_8_bits(tmp_path, kernel_backend):
    """llama.cpp may leave small matrices float (here in_proj_b / in_proj_a, fused with the Q8_0 qkv and z
    into one projection): they are held at 8 bits so the projection stays packed, within 1/254 of each
    32-column group's largest weight."""
    layer_types = ["linear_attention", "full_attention"] * 2
    model = tiny_hf_model("qwen3_5", tied=False, layer_types=layer_types, linear_value_head_dim=32)
    path = write_qwen35_gguf(model, tmp_path / "q.gguf", qtype=Q.Q8_0, keep_float=("in_proj_b", "in_proj_a"))
    src = load_gguf(path)
    dense = dict(src.weights())
    packed = dict(src.quantized_weights())
    name = "model.layers.0.linear_attn.in_proj_b.weight"
    assert packed[name].bits == 8 and packed[name].group_size == 32
    groups = dense[name].abs().reshape(dense[name].shape[0], -1, 32).amax(-1, keepdim=True)
    err = (dequantize(packed[name]) - dense[name]).abs().reshape(groups.shape[0], -1, 32)
    assert (err <= groups / 254 * 1.01).all()  # half a step, and the fp16 scale's rounding
    assert "model.layers.0.linear_attn.conv1d.weight" not in packed  # a [C, 4] kernel stays dense
    kernel_backend("triton")
    llm = LLM(path, weight_quant="none", device=DEVICE)
    in_proj = llm.model.model.layers[0].linear_attn.in_proj
    assert in_proj.qweight is not None and in_proj.weight is None


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_1])
def test_planner_counts_the_gguf_bytes_the_loader_holds(tmp_path, kernel_backend, qtype):
    """`ninfer plan` on a GGUF (gpu_tensors + held_weight_bytes) = what the packed loader keeps: blocks
    packed (Q5_1 re-quantized to 6 bits), out_proj (16-column value heads) and the vectors dense; the
    file's MTP head only with spec mtp."""
    from engine.formats.gguf import gpu_tensors
    from engine.plan.model import resolve
    from engine.plan.weights import held_weight_bytes

    model = tiny_hf_model("qwen3_5", tied=False, layer_types=["linear_attention", "full_attention"] * 2)
    path = write_qwen35_gguf(model, tmp_path / "q.gguf", mtp_head_tensors(model), qtype=qtype)
    kernel_backend("triton")
    config, tensors = gpu_tensors(path)
    for spec in ("none", "mtp"):
        llm = LLM(path, weight_quant="none", device=DEVICE, spec=spec)
        packed = {id(m.qweight): m.qweight.nbytes for m in llm.model.modules() if getattr(m, "qweight", None)}
        held = sum(packed.values()) + sum(p.numel() * p.element_size() for p in llm.model.parameters())
        planned = held_weight_bytes(tensors, config, dtype_bytes=4, mtp=spec == "mtp")
        assert len(packed) >= 8 and held == sum(planned.values())
        assert (planned["mtp head"] > 0) == (spec == "mtp")
    planned = resolve(str(path), None, None, None, mtp=False, vision=False)
    assert planned.packed_weights and planned.recipe == "GGUF blocks as stored"


def test_missing_linear_attention_key_is_named(model, tmp_path, monkeypatch):
    monkeypatch.setattr(gguf.GGUFWriter, "add_ssm_time_step_rank", lambda writer, value: None)
    path = write_qwen35_gguf(model, tmp_path / "no-time-step-rank.gguf")
    with pytest.raises(NinferError, match=r"lacks the metadata key qwen35\.ssm\.time_step_rank"):
        load_gguf(path)


def test_qwen35_pre_tokenizer_keeps_combining_marks_in_their_word():
    """Qwen3.5's split adds \\p{M} to the letter runs: 'e' + U+0301 stays one piece (Qwen2's splits it)."""
    text = "Cafe\u0301 ok"

    def pieces(pre: str) -> list[str]:
        backend = HFTokenizer(BPE())
        backend.pre_tokenizer = _pre_tokenizer(pre)
        return [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(text)]

    assert len(pieces("qwen35")) == 2
    assert len(pieces("qwen2")) == 3
