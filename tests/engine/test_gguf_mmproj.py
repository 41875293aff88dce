"""A GGUF model's vision tower from llama.cpp's mmproj file (`--mmproj`): the tower's keys and tensors as
llama.cpp's converter writes them for Qwen3.5 and Qwen3-VL, read back into the HF tower; images give
transformers' tokens; files that do not fit are refused in one line."""

from __future__ import annotations

from types import SimpleNamespace

import gguf
import pytest
import torch
from conftest import TINY_PREPROCESSOR, tiny_vl_model
from test_gguf_qwen35 import close_gguf, gguf_name, gguf_writer, write_qwen35_gguf
from test_vision import END, PAD, START, assert_matches, hf_reference, png, run

from engine import LLM, NinferError, SamplingParams
from engine.formats.gguf import load_gguf
from engine.formats.gguf_file import GGUFFile
from engine.formats.gguf_mmproj import tower_weights, with_mmproj
from engine.quant.layer import holds_packed_weights

# the Triton-forced engines: on the GPU where there is one (the interpreter runs them only on the CPU), in
# fp32 there as here, so their tokens compare with the CPU reference's
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_DEVICE = dict(device=DEVICE, dtype="float32")

LAYER_TYPES = ["linear_attention", "full_attention"] * 2  # the GGUF helper's full-attention interval, 2


def vocabulary(model) -> list[str]:
    """Token spellings with the placeholders at the model's ids (the rest made up)."""
    cfg = model.config
    tokens = [f"t{i}" for i in range(cfg.text_config.vocab_size)]
    tokens[cfg.image_token_id] = "<|image_pad|>"
    tokens[cfg.video_token_id] = "<|video_pad|>"
    tokens[cfg.vision_start_token_id] = "<|vision_start|>"
    tokens[cfg.vision_end_token_id] = "<|vision_end|>"
    return tokens


def text_part(model) -> SimpleNamespace:
    """The multimodal model's text part as a text checkpoint names it (model.*, lm_head)."""
    state = {
        name.replace("model.language_model.", "model."): t
        for name, t in model.state_dict().items()
        if not name.startswith("model.visual.")
    }
    return SimpleNamespace(config=model.config.text_config, state_dict=lambda: state)


def write_mmproj(model, path, projection_dim: int | None = None, projector: str = "qwen3vl_merger"):
    """The tower as llama.cpp's converter writes an mmproj: clip keys, the block tensors through the gguf
    package's own name map, the merger as mm.0 / mm.2 and v.post_ln, deepstack levels numbered by the
    block they follow, the Conv3d patch kernel cut into its two frames (F16 matrices, F32 vectors)."""
    vision = model.config.vision_config
    deepstack = list(getattr(vision, "deepstack_visual_indexes", None) or [])
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(projector)
    w.add_vision_projection_dim(projection_dim or vision.out_hidden_size)
    w.add_vision_image_size(int(vision.num_position_embeddings**0.5 * vision.patch_size))
    w.add_vision_patch_size(vision.patch_size)
    w.add_vision_embedding_length(vision.hidden_size)
    w.add_vision_feed_forward_length(vision.intermediate_size)
    w.add_vision_block_count(vision.depth)
    w.add_vision_head_count(vision.num_heads)
    w.add_vision_image_mean(TINY_PREPROCESSOR["image_mean"])
    w.add_vision_image_std(TINY_PREPROCESSOR["image_std"])
    w.add_vision_use_gelu(True)
    w.add_vision_spatial_merge_size(vision.spatial_merge_size)
    w.add_vision_attention_layernorm_eps(1e-6)
    w.add_vision_min_pixels(TINY_PREPROCESSOR["size"]["shortest_edge"])
    w.add_vision_max_pixels(TINY_PREPROCESSOR["size"]["longest_edge"])
    if deepstack:
        w.add_vision_is_deepstack_layers([i in deepstack for i in range(vision.depth)])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vision.depth)
    merger = {"norm": "v.post_ln", "linear_fc1": "mm.0", "linear_fc2": "mm.2"}
    for hf, t in model.state_dict().items():
        if not hf.startswith("model.visual."):
            continue
        name, t = hf.removeprefix("model."), t.float()
        parts = name.split(".")
        if name == "visual.patch_embed.proj.weight":
            tensors = {"v.patch_embd.weight": t[:, :, 0], "v.patch_embd.weight.1": t[:, :, 1]}
        elif parts[1] == "merger":
            tensors = {f"{merger[parts[2]]}.{parts[3]}": t}
        elif parts[1] == "deepstack_merger_list":
            block = deepstack[int(parts[2])]
            tensors = {f"v.deepstack.{block}.{parts[3].replace('linear_', '')}.{parts[4]}": t}
        else:
            tensors = {names.get_name(name, try_suffixes=(".weight", ".bias")): t}
        for gguf_name_, tensor in tensors.items():
            w.add_tensor(gguf_name_, tensor.numpy().astype("float16" if tensor.dim() > 1 else "float32"))
    return close_gguf(w, path)


def write_qwen3vl_gguf(model, path, arch: str = "qwen3vl", tokens: bool = True):
    """Qwen3-VL's text model as the converter writes it (arch qwen3vl: Qwen3's tensors, M-RoPE sections);
    `arch` qwen3: the same tensors as a plain Qwen3 GGUF; `tokens` False: no vocabulary."""
    text = text_part(model)
    cfg = text.config
    w = gguf_writer(path, arch, cfg, cfg.num_hidden_layers)
    w.add_rope_dimension_sections([*cfg.rope_parameters["mrope_section"], 0])
    if tokens:
        w.add_token_list(vocabulary(model))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, cfg.num_hidden_layers)
    for hf, t in text.state_dict().items():
        w.add_tensor(gguf_name(names, hf, cfg.num_hidden_layers), t.float().numpy())
    return close_gguf(w, path)


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    """(transformers model, text GGUF, mmproj) of a tiny Qwen3.5 with its tower."""
    model = tiny_vl_model(layer_types=LAYER_TYPES)
    folder = tmp_path_factory.mktemp("q35mm")
    sections = (*model.config.text_config.rope_parameters["mrope_section"], 0)
    text = write_qwen35_gguf(text_part(model), folder / "m.gguf", sections=sections, tokens=vocabulary(model))
    return model, text, write_mmproj(model, folder / "mmproj-m.gguf")


@pytest.fixture(scope="module")
def qwen35_llm(qwen35):
    _, text, mmproj = qwen35
    return LLM(text, mmproj=str(mmproj))


def test_the_tower_tensors_come_back_as_the_checkpoint_holds_them(qwen35):
    model, _, mmproj = qwen35
    got = dict(tower_weights(GGUFFile(str(mmproj)), []))
    want = {n: t for n, t in model.state_dict().items() if n.startswith("model.visual.")}
    assert set(got) == set(want)
    for name, t in want.items():  # the mmproj's matrices are F16
        assert got[name].shape == t.shape and torch.allclose(got[name], t.float(), atol=2e-3), name


def test_the_config_comes_from_the_clip_keys_and_the_text_gguf(qwen35):
    model, text, mmproj = qwen35
    config = with_mmproj(load_gguf(text), text, mmproj).config
    vision, want = config.vision_config, model.config.vision_config
    for key in ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size", "patch_size"):
        assert vision[key] == getattr(want, key), key
    assert vision["num_position_embeddings"] == want.num_position_embeddings
    assert vision["temporal_patch_size"] == 2 and vision["deepstack_visual_indexes"] == []
    assert (vision["image_token_id"], vision["vision_start_token_id"], vision["vision_end_token_id"]) == (
        PAD,
        START,
        END,
    )
    assert vision["preprocessor"]["min_pixels"] == TINY_PREPROCESSOR["size"]["shortest_edge"]
    assert config.mrope_section == tuple(model.config.text_config.rope_parameters["mrope_section"])
    assert config.mrope_interleaved


def test_qwen35_gguf_with_its_mmproj_matches_transformers(qwen35, qwen35_llm):
    """Two images and text between them: transformers' greedy tokens and log-probabilities."""
    model, *_ = qwen35
    assert qwen35_llm.model.visual is not None and qwen35_llm.engine_config.vision
    prompt = [4, START, PAD, END, 19, 21, START, PAD, END, 300, 7]
    images = [png(45, 70, seed=3), png(64, 64, seed=4)]
    # the mmproj's F16 matrices against the checkpoint's fp32: the log-probabilities a little apart
    assert_matches(run(qwen35_llm, prompt, images), hf_reference(model, prompt, images), atol=5e-3)


def test_qwen3_vl_gguf_with_deepstack_matches_transformers(tmp_path):
    """Qwen3-VL (arch qwen3vl): the deepstack levels, numbered by block in the mmproj, land on their
    mergers; the tower's output is transformers'."""
    model = tiny_vl_model(arch="qwen3_vl")
    text = write_qwen3vl_gguf(model, tmp_path / "vl.gguf")
    llm = LLM(text, mmproj=str(write_mmproj(model, tmp_path / "mmproj-vl.gguf")), prefill_chunk=16)
    assert len(llm.model.visual.deepstack_merger_list) == 2
    prompt = [4, START, PAD, END, 19, 300, 7]
    images = [png(64, 40, seed=16)]
    assert_matches(run(llm, prompt, images), hf_reference(model, prompt, images), atol=5e-3)


def test_text_prompts_are_unchanged_by_the_tower(qwen35, qwen35_llm):
    _, text, _ = qwen35
    prompt = [4, 80, 19, 300, 2, 45]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    plain = LLM(text).generate(prompt_token_ids=prompt, sampling_params=params)[0]
    with_tower = qwen35_llm.generate(prompt_token_ids=prompt, sampling_params=params)[0]
    assert with_tower.token_ids == plain.token_ids


def test_mismatched_files_are_refused_in_a_sentence(qwen35, tmp_path):
    model, text, mmproj = qwen35
    cases = {
        # the text GGUF given as the mmproj
        str(text): "is not an mmproj file",
        # another model's tower: its projection is not this model's width
        str(write_mmproj(model, tmp_path / "wide.gguf", projection_dim=96)): "belongs to another model",
        str(write_mmproj(model, tmp_path / "gemma.gguf", projector="gemma3")): "'gemma3' projector",
        str(tmp_path / "missing.gguf"): "does not exist",
    }
    for path, words in cases.items():
        with pytest.raises(NinferError, match=words):
            LLM(text, mmproj=path)


def test_the_mmproj_needs_a_gguf_with_image_positions(tmp_path):
    """An HF checkpoint, a GGUF without M-RoPE, a vocabulary without the placeholders: one line each."""
    from conftest import save_tiny_vl

    model = tiny_vl_model(arch="qwen3_vl")
    mmproj = str(write_mmproj(model, tmp_path / "mmproj.gguf"))
    with pytest.raises(NinferError, match="drop --mmproj and pass --vision"):
        LLM(save_tiny_vl(model, tmp_path / "hf"), mmproj=mmproj)
    with pytest.raises(NinferError, match="'qwen3' model, whose positions have no image axes"):
        LLM(write_qwen3vl_gguf(model, tmp_path / "q3.gguf", arch="qwen3"), mmproj=mmproj)
    with pytest.raises(NinferError, match="vocabulary has no <\\|image_pad\\|>"):
        LLM(write_qwen3vl_gguf(model, tmp_path / "bare.gguf", tokens=False), mmproj=mmproj)


def test_plan_counts_the_mmproj_tower_and_prints_it_in_the_serve_line(qwen35):
    """`ninfer plan MODEL.gguf --mmproj F`: the tower's row at what the engine holds (bf16), the serve line
    carries --mmproj; a preset or an HF directory with --mmproj is refused in one line."""
    import json

    from typer.testing import CliRunner

    from ninfer_cli.main import app

    _, text, mmproj = qwen35

    def plan(*flags):
        result = CliRunner().invoke(app, ["plan", str(text), "--vram", "1G", "--json", *flags])
        return result.exit_code, result.output

    code, out = plan("--mmproj", str(mmproj))
    assert code == 0, out
    planned = json.loads(out)["plan"]
    rows = {r["component"]: r["bytes"] for r in planned["ledger"]}
    tower = LLM(text, mmproj=str(mmproj), dtype="bfloat16").model.visual
    assert rows["weights: vision tower"] == sum(p.numel() * p.element_size() for p in tower.parameters())
    assert f"--mmproj {mmproj}" in planned["serve"] and "--vision" not in planned["serve"]
    code, out = plan()
    assert code == 0 and "weights: vision tower" not in out
    result = CliRunner().invoke(app, ["plan", "--model", "qwen3.5-27b", "--vram", "24G", "--mmproj", "x"])
    assert result.exit_code == 2 and "drop --mmproj" in result.output


def test_a_block_quantized_gguf_takes_the_tower_beside_its_packed_matrices(
    qwen35, qwen35_llm, tmp_path, kernel_backend
):
    """Q8_0 text matrices: kept packed for the fused kernels (interpreted here), or as the CPU's int4 / int8
    copies, the tower loads beside them from the mmproj, and an image step gives the naive path's tokens."""
    model, _, mmproj = qwen35
    sections = (*model.config.text_config.rope_parameters["mrope_section"], 0)
    path = write_qwen35_gguf(
        text_part(model),
        tmp_path / "q8.gguf",
        qtype=gguf.GGMLQuantizationType.Q8_0,
        sections=sections,
        tokens=vocabulary(model),
    )
    prompt, images = [4, START, PAD, END, 19, 300, 7], [png(40, 56, seed=9)]
    kernel_backend("naive")
    cpu = LLM(path, mmproj=str(mmproj))  # the CPU's copies of the blocks
    dense = run(LLM(path, mmproj=str(mmproj), weight_quant="none"), prompt, images)
    kernel_backend("triton")
    packed_llm = LLM(path, mmproj=str(mmproj), weight_quant="none", **ON_DEVICE)
    assert holds_packed_weights(packed_llm.model)
    tower = dict(qwen35_llm.model.visual.named_parameters())
    for llm in (cpu, packed_llm):
        for name, p in llm.model.visual.named_parameters():
            assert torch.equal(p.cpu(), tower[name]), name
    packed = run(packed_llm, prompt, images)
    assert packed.token_ids == dense.token_ids
    for a, b in zip(packed.logprobs, dense.logprobs):
        assert all(abs(a[t] - b[t]) < 1e-3 for t in b)


def test_convert_takes_the_mmproj_into_the_artifact(qwen35, qwen35_llm, tmp_path):
    """`ninfer convert MODEL.gguf OUT.ninfer --mmproj F`: one file with the tower (16-bit), which then
    serves images with --vision as the GGUF and its mmproj do."""
    from typer.testing import CliRunner

    from ninfer_cli.main import app

    _, text, mmproj = qwen35
    out = tmp_path / "vl.ninfer"
    args = ["convert", str(text), str(out), "--recipe", "bf16", "--method", "rtn", "--mmproj", str(mmproj)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    artifact = LLM(out, vision=True)
    assert artifact.model_config.mrope_section == qwen35_llm.model_config.mrope_section
    prompt, images = [4, START, PAD, END, 19, 300, 7], [png(40, 56, seed=9)]
    want = run(qwen35_llm, prompt, images)
    got = run(artifact, prompt, images)
    assert got.token_ids == want.token_ids
    result = CliRunner().invoke(app, [*args[:2], str(tmp_path / "x.ninfer"), "--mmproj", str(text)])
    assert result.exit_code == 2 and "is not an mmproj file" in result.output
    assert not (tmp_path / "x.ninfer").exists()


def test_mmproj_implies_vision_and_refuses_a_draft_model():
    from engine.config import EngineConfig

    assert EngineConfig(model="m.gguf", mmproj="mmproj.gguf").vision
    with pytest.raises(NinferError, match="a draft model drafts text; drop --mmproj"):
        EngineConfig(model="m.gguf", mmproj="mmproj.gguf", spec="draft", draft_model="d.gguf")
