"""Images in the prompt: preprocessing, the vision tower, M-RoPE positions and image embeddings through
the engine, against transformers' Qwen3.5 (Qwen3_5ForConditionalGeneration and its PIL image processor) and
Qwen3-VL (Qwen3VLForConditionalGeneration: a Qwen3 text model, deepstack levels from the tower) and
Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration: Qwen3-MoE's layers)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from conftest import TINY_PREPROCESSOR, mtp_head_tensors, save_tiny_vl, tiny_hf_model, tiny_vl_model

from engine.errors import NinferError
from engine.llm import LLM
from engine.request import SamplingParams
from engine.vision.config import VisionConfig
from engine.vision.image import preprocess
from engine.vision.mrope import frequency_axes

PAD, START, END = 500, 502, 503
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)


def png(height: int, width: int, seed: int = 0, mode: str = "RGB") -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    if mode != "RGB":
        image = image.convert(mode)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def hf_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    p = TINY_PREPROCESSOR
    return Qwen2VLImageProcessorPil(
        patch_size=p["patch_size"],
        merge_size=p["merge_size"],
        temporal_patch_size=p["temporal_patch_size"],
        image_mean=p["image_mean"],
        image_std=p["image_std"],
        size=p["size"],
    )


@pytest.fixture(scope="module")
def vl_model():
    return tiny_vl_model()


@pytest.fixture(scope="module")
def vl_dir(vl_model, tmp_path_factory):
    return save_tiny_vl(vl_model, tmp_path_factory.mktemp("vl"))


@pytest.fixture(scope="module")
def llm(vl_dir):
    return LLM(vl_dir, vision=True)


def run(llm: LLM, prompt: list[int], images: list[bytes], params=GREEDY):
    request_id = llm.add_request(prompt, params, images=[llm.image(b) for b in images])
    while True:
        for out, _ in llm.step():
            if out.request_id == request_id and out.finished:
                return out


def hf_reference(model, prompt: list[int], images: list[bytes], num_tokens: int = 6):
    """transformers' greedy tokens and per-step log-softmax for `prompt` (one PAD per image, widened here)."""
    from PIL import Image

    batch = hf_processor()(
        images=[Image.open(io.BytesIO(b)).convert("RGB") for b in images], return_tensors="pt"
    )
    merge = TINY_PREPROCESSOR["merge_size"] ** 2
    counts = iter((batch["image_grid_thw"].prod(-1) // merge).tolist())
    ids = [t for tok in prompt for t in ([PAD] * next(counts) if tok == PAD else [tok])]
    model.generation_config.eos_token_id = None
    out = model.generate(
        torch.tensor([ids]),
        pixel_values=batch["pixel_values"],
        image_grid_thw=batch["image_grid_thw"],
        mm_token_type_ids=torch.tensor([[int(t == PAD) for t in ids]]),
        max_new_tokens=num_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    return out.sequences[0, len(ids) :].tolist(), [torch.log_softmax(s[0].float(), -1) for s in out.logits]


def assert_matches(out, reference, atol: float = 5e-4):
    tokens, logprobs = reference
    assert out.token_ids == tokens
    for step, token, ref in zip(out.logprobs, tokens, logprobs):
        assert step[token] == pytest.approx(ref[token].item(), abs=atol)


# -- preprocessing ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "height, width, mode",
    [(45, 70, "RGB"), (32, 32, "RGB"), (200, 90, "RGB"), (13, 40, "RGB"), (50, 50, "RGBA"), (40, 60, "L")],
)
def test_patches_match_transformers_processor(vl_dir, height, width, mode):
    """Resized (up, down, kept), normalized and patchified as transformers' processor does, in its order."""
    from PIL import Image

    data = png(height, width, mode=mode)
    vision = json.loads((vl_dir / "config.json").read_text())["vision_config"]
    config = VisionConfig.from_dict({**vision, "preprocessor": TINY_PREPROCESSOR})
    ours = preprocess(data, config)
    image = Image.open(io.BytesIO(data))
    if mode == "RGBA":  # transparent pixels over white, as ours composes them
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image)
    ref = hf_processor()(images=[image.convert("RGB")], return_tensors="pt")
    assert ours.grid_thw == tuple(ref["image_grid_thw"][0].tolist())
    assert ours.num_tokens == ours.grid_thw[1] * ours.grid_thw[2] // 4
    torch.testing.assert_close(ours.pixel_values, ref["pixel_values"], atol=1e-5, rtol=0)


def test_a_lower_pixel_limit_shrinks_the_image(llm):
    """max_pixels (OpenAI's detail "low") below the preprocessor's: a 128 x 64 image within 64 x 64 pixels'
    worth is 80 x 32 (5 x 2 tokens of 16 x 16 pixels); within 32 x 32, 32 x 16 (2 tokens); the cache keeps
    the two apart."""
    data = png(64, 128, seed=18)
    assert llm.image(data).num_tokens == 10
    assert llm.image(data, max_pixels=32 * 32).num_tokens == 2
    assert llm.image(data).num_tokens == 10


def test_bad_image_bytes_are_refused_in_a_sentence(llm):
    with pytest.raises(NinferError, match="not a PNG, JPEG, WebP, GIF or BMP image"):
        llm.image(b"GIF89a but not really")
    with pytest.raises(NinferError, match="sides differ by more than 200x"):
        llm.image(png(2, 500))


def test_interleaved_frequency_axes():
    """Qwen3.5's 64-dim rotary: t, h, w interleaved over 11 / 11 / 10 frequency pairs, then time."""
    axes = frequency_axes((11, 11, 10), True, 32).tolist()
    assert axes[:6] == [0, 1, 2, 0, 1, 2] and axes[30:] == [0, 1]
    assert axes.count(1) == 11 and axes.count(2) == 10
    assert frequency_axes((2, 1, 1), False, 4).tolist() == [0, 0, 1, 2]
    with pytest.raises(NinferError, match="mrope_section"):
        frequency_axes((2, 2, 2), True, 4)


# -- the engine against transformers -----------------------------------------------------------------
def test_one_image_matches_transformers(llm, vl_model):
    prompt = [4, 80, START, PAD, END, 19, 300, 7]
    images = [png(45, 70)]
    assert_matches(run(llm, prompt, images), hf_reference(vl_model, prompt, images))


def test_two_images_and_text_between_match_transformers(llm, vl_model):
    """Two images of different grids (one taller than wide), text before, between and after them."""
    prompt = [4, START, PAD, END, 19, 21, START, PAD, END, 300, 7]
    images = [png(64, 40, seed=1), png(33, 60, seed=2)]
    assert_matches(run(llm, prompt, images), hf_reference(vl_model, prompt, images))


def test_the_picture_matters(llm):
    prompt = [4, START, PAD, END, 19]
    a, b = (run(llm, prompt, [png(48, 48, seed=s)]) for s in (3, 4))
    assert a.logprobs[0] != b.logprobs[0]


@pytest.fixture(scope="module")
def qwen3_vl(tmp_path_factory):
    model = tiny_vl_model(arch="qwen3_vl")
    return model, LLM(save_tiny_vl(model, tmp_path_factory.mktemp("qwen3_vl")), vision=True, prefill_chunk=16)


def test_qwen3_vl_matches_transformers(qwen3_vl):
    """Qwen3-VL: the Qwen3 text model with M-RoPE, the tower's deepstack levels added to the first two
    layers' outputs at the image tokens; two images, the second cut by the 16-token prefill chunks."""
    model, llm = qwen3_vl
    assert len(llm.model.visual.deepstack_merger_list) == 2
    prompt = [4, START, PAD, END, 19, 21, START, PAD, END, 300, 7]
    images = [png(64, 40, seed=16), png(33, 60, seed=17)]
    assert_matches(run(llm, prompt, images), hf_reference(model, prompt, images))


def save_vl_moe(model, path, layout: str):
    """The tiny Qwen3-VL-MoE saved as transformers 5 saves it ([E, 2I, H], [E, H, I] experts), or
    `published`: its stacked experts transposed, as the published checkpoints store them."""
    from safetensors.torch import load_file, save_file

    save_tiny_vl(model, path)
    if layout == "published":
        file = path / "model.safetensors"
        tensors = load_file(file)
        experts = [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
        assert len(experts) == 4  # layers 0 and 2
        save_file(
            {n: t.transpose(1, 2).contiguous() if n in experts else t for n, t in tensors.items()}, file
        )
    return path


@pytest.mark.parametrize("layout", ["as_saved", "published"])
def test_qwen3_vl_moe_matches_transformers(tmp_path, layout):
    """Qwen3-VL-MoE: Qwen3-VL with mixture-of-experts layers (layer 1 dense). Its experts load as
    transformers 5 saves them and as the published checkpoints store them, each transposed; two images,
    the second cut by the prefill chunks."""
    model = tiny_vl_model(arch="qwen3_vl_moe")
    llm = LLM(save_vl_moe(model, tmp_path / "qwen3_vl_moe", layout), vision=True, prefill_chunk=16)
    assert [llm.model_config.is_sparse_layer(i) for i in range(3)] == [True, False, True]
    prompt = [4, START, PAD, END, 19, 21, START, PAD, END, 300, 7]
    images = [png(64, 40, seed=16), png(33, 60, seed=17)]
    assert_matches(run(llm, prompt, images), hf_reference(model, prompt, images))


def test_image_split_across_prompt_chunks(vl_dir, vl_model):
    """A 6-token prefill budget cuts the 16-token image into pieces: each chunk takes its own rows."""
    chunked = LLM(vl_dir, vision=True, prefill_chunk=6, max_concurrency=2)
    prompt = [4, 80, START, PAD, END, 19]
    images = [png(64, 64, seed=5)]
    assert_matches(run(chunked, prompt, images), hf_reference(vl_model, prompt, images))


def test_prefix_cache_tells_pictures_apart(vl_dir, vl_model):
    """Same placeholders, other picture: the cached pages of the first are not reused for the second.
    Same picture again: they are."""
    cached = LLM(vl_dir, vision=True, block_size=4, state_snapshot_interval=4)
    prompt = [4, 80, 81, 82, START, PAD, END, 19, 300, 7, 8, 9]
    first, second = [png(64, 64, seed=6)], [png(64, 64, seed=7)]
    assert_matches(run(cached, prompt, first), hf_reference(vl_model, prompt, first))
    other = run(cached, prompt, second)
    assert_matches(other, hf_reference(vl_model, prompt, second))
    assert other.num_cached_tokens <= 4  # the text before the image, at most
    again = run(cached, prompt, first)
    assert again.num_cached_tokens > 4 + 16
    assert_matches(again, hf_reference(vl_model, prompt, first))


def test_a_snapshot_hint_after_an_image_counts_the_image_widened(vl_dir, vl_model):
    """A hint given in the prompt's positions before images widen (as the API works them out) lands on the
    same token after: a prompt sharing the text up to it resumes there, the image's 16 tokens counted."""
    llm = LLM(vl_dir, vision=True, block_size=4)
    head = [4, 80, START, PAD, END, *range(100, 140)]  # 45 tokens; 60 once the image widens
    image = [png(64, 64, seed=8)]
    request_id = llm.add_request(
        [*head, *range(200, 220)], GREEDY, images=[llm.image(image[0])], snapshot_hints=(45,)
    )
    while llm.has_unfinished_requests():
        llm.step()
    second = [*head, *range(300, 310)]
    out = run(llm, second, image)
    assert request_id and out.num_cached_tokens == 60
    assert_matches(out, hf_reference(vl_model, second, image))


def test_positions_before_widening_map_past_each_image_before_them():
    from types import SimpleNamespace

    from engine.vision.mrope import MultiModalInputs

    # placeholders at 2 and 5 before widening: 16 and 4 tokens after it (first indices 2 and 20)
    images = (SimpleNamespace(num_tokens=16), SimpleNamespace(num_tokens=4))
    mm = MultiModalInputs(images, (2, 20), torch.zeros(3, 1), 0)
    assert mm.widened((0, 2, 3, 5, 6, 9)) == (0, 2, 18, 20, 24, 27)


@pytest.mark.parametrize("spec", ["ngram", "mtp"])
def test_speculative_decoding_keeps_the_output(vl_dir, vl_model, tmp_path, spec):
    """Drafts over a prompt with an image (the MTP head reads the image tokens' 3D positions) leave the
    greedy tokens unchanged."""
    path = vl_dir
    if spec == "mtp":
        import shutil

        from safetensors.torch import save_file

        path = tmp_path / "vl_mtp"
        shutil.copytree(vl_dir, path)
        text_model = tiny_hf_model("qwen3_5", tied=False)  # the same shapes as the VL model's text part
        save_file(mtp_head_tensors(text_model), str(path / "mtp.safetensors"))
        config = json.loads((path / "config.json").read_text())
        config["text_config"]["mtp_num_hidden_layers"] = 1
        (path / "config.json").write_text(json.dumps(config))
    drafting = LLM(path, vision=True, spec=spec, draft_tokens=3)
    prompt = [4, 80, START, PAD, END, 19, 300, 7]
    images = [png(40, 64, seed=8)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    out = run(drafting, prompt, images, params)
    assert_matches(out, hf_reference(vl_model, prompt, images, 12))
    if spec == "mtp":
        assert out.num_draft_tokens > 0


def test_triton_kernels_take_image_steps(vl_dir, vl_model, kernel_backend):
    """The Triton kernels (interpreted on the CPU): the rope kernel over the per-token M-RoPE table, the
    attention and the chunked delta rule give transformers' tokens."""
    kernel_backend("triton")
    prompt = [4, START, PAD, END, 19]
    images = [png(40, 40, seed=9)]
    out = run(LLM(vl_dir, vision=True), prompt, images)
    assert out.token_ids == hf_reference(vl_model, prompt, images)[0]


# -- refusals -------------------------------------------------------------------------------------------
def test_placeholders_must_match_the_images(llm):
    with pytest.raises(NinferError, match=r"1 image placeholder\(s\) \(<\|image_pad\|>\) for 2 image\(s\)"):
        llm.add_request([4, PAD, 5], GREEDY, images=[llm.image(png(32, 32))] * 2)
    with pytest.raises(NinferError, match=r"1 image placeholder\(s\) \(<\|image_pad\|>\) for 0 image\(s\)"):
        llm.add_request([4, PAD, 5], GREEDY)  # a history whose pictures were left out
    llm.abort(llm.add_request([4, 5], GREEDY))  # text alone still goes


def test_without_the_tower_images_are_refused(vl_dir, llm):
    text_only = LLM(vl_dir)
    assert text_only.model.visual is None
    with pytest.raises(NinferError, match="start it with --vision"):
        text_only.image(png(32, 32))
    # bench's roofline: a decode step reads no vision tower (the same bytes with it loaded)
    from engine.bench.roofline import cost_of_llm

    assert llm.model.visual is not None
    assert cost_of_llm(llm).weight_bytes == cost_of_llm(text_only).weight_bytes


def test_text_models_refuse_vision(tmp_path):
    from conftest import save_tiny

    save_tiny(tiny_hf_model("qwen3", tied=True), tmp_path)
    with pytest.raises(NinferError, match="Qwen3ForCausalLM checkpoint has no vision tower .* drop --vision"):
        LLM(tmp_path, vision=True)


def test_a_checkpoint_without_tower_weights_is_named(vl_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = {k: v for k, v in load_file(str(vl_dir / "model.safetensors")).items() if "visual" not in k}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((vl_dir / "config.json").read_text())
    with pytest.raises(NinferError, match="declares a vision tower but lacks its weights"):
        LLM(tmp_path, vision=True)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["none", "ngram"])
def test_cuda_matches_transformers(vl_dir, vl_model, spec):
    """On CUDA: the Triton kernels, the tower on the GPU, decode steps replayed from CUDA graphs at
    index + rope_delta (with drafts: padded to one query count)."""
    cuda = LLM(vl_dir, vision=True, device="cuda", dtype="float32", spec=spec, max_concurrency=2)
    assert cuda.runner.graphs is not None
    prompt = [4, 80, START, PAD, END, 19, 300, 7]
    images = [png(64, 48, seed=10)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    assert_matches(run(cuda, prompt, images, params), hf_reference(vl_model, prompt, images, 12))


def test_a_converted_artifact_keeps_the_tower_in_16_bits(vl_dir, tmp_path):
    """`ninfer convert` leaves the tower unquantized (bf16, as it ships) under every recipe, with the
    preprocessor's settings in the artifact's config; the artifact serves images like its source."""
    from engine.quant.convert import convert

    out = tmp_path / "vl-w8.ninfer"
    convert(vl_dir, out, "w8g128", method="rtn")
    artifact = LLM(out, vision=True)
    source = LLM(vl_dir, vision=True)
    for (name, ours), (_, theirs) in zip(
        artifact.model.visual.named_parameters(), source.model.visual.named_parameters()
    ):
        assert torch.equal(ours, theirs.to(torch.bfloat16).float()), name
    assert artifact.model.visual.config == source.model.visual.config  # mean / std / pixel limits kept
    prompt = [4, 80, START, PAD, END, 19]
    images = [png(48, 64, seed=11)]
    a, b = run(artifact, prompt, images), run(source, prompt, images)
    assert a.token_ids[:3] == b.token_ids[:3]
    assert abs(a.logprobs[0][a.token_ids[0]] - b.logprobs[0][a.token_ids[0]]) < 0.05


def test_qwen3_vl_moe_converts_from_the_published_layout(tmp_path):
    """`ninfer convert` of a published Qwen3-VL-MoE checkpoint: the experts quantized in the engine's layout
    (8-bit, within a code of the source's weights), the tower in bf16; it answers an image as its source."""
    from engine.quant.convert import convert

    source_dir = save_vl_moe(tiny_vl_model(arch="qwen3_vl_moe"), tmp_path / "src", "published")
    out = tmp_path / "vl-moe-w8.ninfer"
    rows = {r["kind"]: r for r in convert(source_dir, out, "w8g128", method="rtn")}
    # each expert's matrices stored 8-bit (the stacks split as a per-expert checkpoint names them)
    experts = {k: r["bits"] for k, r in rows.items() if ".mlp.experts" in k}
    assert experts == {
        f"model.language_model.layers.*.mlp.experts.*.{m}_proj.weight": "8" for m in ("gate", "up", "down")
    }
    artifact, source = LLM(out, vision=True), LLM(source_dir, vision=True)
    ours, theirs = artifact.model.model.layers[2].mlp.experts, source.model.model.layers[2].mlp.experts
    for name in ("gate_up_proj", "down_proj"):
        a, b = getattr(ours, name), getattr(theirs, name)  # [E, 2I, H] and [E, H, I]
        assert a.shape == b.shape and not torch.equal(a, b)
        assert (a - b).abs().max() <= b.abs().amax(dim=-1, keepdim=True).max() / 127
    prompt = [4, 80, START, PAD, END, 19]
    images = [png(48, 64, seed=11)]
    a, b = run(artifact, prompt, images), run(source, prompt, images)
    assert abs(a.logprobs[0][b.token_ids[0]] - b.logprobs[0][b.token_ids[0]]) < 0.05


def test_plan_counts_an_artifacts_tower_only_with_vision(vl_dir, tmp_path):
    """The artifact's tower is held only with --vision: without, its bytes are in no row; with, in the
    'vision tower' row, at what the loader holds (bf16)."""
    from safetensors.torch import load_file, save_file
    from typer.testing import CliRunner

    from engine.quant.convert import convert
    from ninfer_cli.main import app

    out = tmp_path / "vl-w4.ninfer"
    convert(vl_dir, out, "w4g128", method="rtn")
    text_dir, text_out = tmp_path / "text", tmp_path / "text-w4.ninfer"  # the same model without a tower
    text_dir.mkdir()
    tensors = load_file(str(vl_dir / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if "visual" not in k}, str(text_dir / "model.safetensors"))
    config = json.loads((vl_dir / "config.json").read_text())
    (text_dir / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "vision_config"})
    )
    convert(text_dir, text_out, "w4g128", method="rtn")

    def ledger(artifact, *flags):
        result = CliRunner().invoke(app, ["plan", str(artifact), "--vram", "1G", "--json", *flags])
        assert result.exit_code == 0, result.output
        rows = json.loads(result.output)["plan"]["ledger"]
        return {r["component"]: r["bytes"] for r in rows if r["component"].startswith("weights")}

    plain, with_tower = ledger(out), ledger(out, "--vision")
    assert plain == ledger(text_out)
    tower = LLM(out, vision=True, dtype="bfloat16").model.visual
    held = sum(p.numel() * p.element_size() for p in tower.parameters())
    assert with_tower.pop("weights: vision tower") == held
    assert with_tower == plain


def test_tower_attention_takes_the_memory_efficient_kernels(llm, monkeypatch):
    """The tower calls SDPA with [batch, heads, N, D]: a 3D call falls back to materialising N x N
    scores (at 2048 x 2048 pixels, 16 heads x 16384² floats: 17 GB on the CPU)."""
    import engine.vision.tower as tower

    shapes = []
    real = tower.F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        shapes.append(q.dim())
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(tower.F, "scaled_dot_product_attention", spy)
    llm.image(png(40, 40))  # preprocessing alone runs no attention
    item = llm.image(png(48, 48))
    llm.model.visual(item.pixel_values, item.grid_thw)
    assert shapes == [4] * llm.model.visual.config.depth


def test_the_same_bytes_are_preprocessed_once(llm):
    """An agent resends its screenshots every turn: the same bytes come back from the cache; past its
    budget the least recently used go first."""
    from engine.vision.image import ImageCache

    a, b = png(48, 48, seed=12), png(48, 48, seed=13)
    assert llm.image(a) is llm.image(a)
    one = llm.image(a).pixel_values
    cache = ImageCache(llm.model.visual.config, max_bytes=one.numel() * one.element_size())
    first = cache(a)
    assert cache(a) is first
    cache(b)  # over budget: a goes
    assert cache(a) is not first and torch.equal(cache(a).pixel_values, first.pixel_values)


def test_a_preempted_request_with_images_recomputes_them(vl_dir):
    """A KV pool too small for two image requests to finish side by side: the later one is preempted,
    recomputed (its picture encoded again where its pages were lost) and answers as it does alone."""
    prompts = [[4, 80, START, PAD, END, 19], [5, 81, START, PAD, END, 20, 21]]
    images = [png(64, 64, seed=14), png(64, 48, seed=15)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    alone = [run(LLM(vl_dir, vision=True), p, [i], params).token_ids for p, i in zip(prompts, images)]
    tight = LLM(
        vl_dir, vision=True, kv_capacity=64, block_size=4, max_concurrency=2, enable_prefix_caching=False
    )
    ids = [tight.add_request(p, params, images=[tight.image(i)]) for p, i in zip(prompts, images)]
    done = {}
    while len(done) < 2:
        for out, _ in tight.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    assert tight.scheduler.num_preemptions > 0
    assert [done[i] for i in ids] == alone


def test_images_past_the_context_are_refused_with_both_numbers(vl_dir):
    small = LLM(vl_dir, vision=True, max_context=24)
    with pytest.raises(
        NinferError, match=r"with its images the prompt is 25 tokens but the context limit is 24"
    ):
        small.add_request(
            [4, START, PAD, END, 19, 20, 21, 22, 23, 24], GREEDY, images=[small.image(png(64, 64))]
        )
    assert not small.has_unfinished_requests()


def test_the_planner_counts_the_tower_the_engine_builds(llm, qwen3_vl):
    """engine/plan/shapes.vision_tensors names every parameter of the tower with its shape (Qwen3.5's, and
    Qwen3-VL's with its deepstack mergers), so the ledger's row is what loading takes."""
    from engine.plan.shapes import vision_tensors

    for engine in (llm, qwen3_vl[1]):
        built = {f"visual.{n}": tuple(p.shape) for n, p in engine.model.visual.named_parameters()}
        assert dict(vision_tensors(engine.model_config)) == built
