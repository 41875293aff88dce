"""LoRA adapters (engine/lora): a request with an adapter runs as the model with the adapter merged into its
weights (peft's merge_and_unload, the reference), beside requests without one or with another."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import save_tiny, tiny_hf_model, write_lora_adapter

from engine.errors import NinferError
from engine.llm import LLM
from engine.request import SamplingParams

TARGETS = {
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    # the hybrid's linear attention projections (fused in_proj shards) and the full-attention layer's
    "qwen3_5": ["in_proj_qkv", "in_proj_z", "out_proj", "q_proj", "v_proj", "o_proj", "down_proj"],
}
PROMPTS = [[3, 17, 42, 5, 99, 7, 23], [11, 4, 8, 15, 16, 23, 42, 61, 2, 9, 30, 31, 77, 5, 6, 70, 71, 12]]


def make_adapter(base, targets, path, seed, r=4, alpha=8, **extra):
    """A peft LoRA adapter on a copy of `base` with random B (peft starts B at zero), saved as peft saves
    it; returns the merged model (the reference)."""
    import copy

    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        copy.deepcopy(base), peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, **extra)
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.save_pretrained(path)
    return model.merge_and_unload().eval()


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def fixture(request, tmp_path_factory):
    arch = request.param
    root = tmp_path_factory.mktemp(f"lora_{arch}")
    base = tiny_hf_model(arch, tied=False, seed=3)
    save_tiny(base, root / "base")
    merged = {
        "a": make_adapter(base, TARGETS[arch], root / "a", seed=1),
        # rsLoRA scaling, a smaller rank, other modules
        "b": make_adapter(base, TARGETS[arch][-3:], root / "b", seed=2, r=2, alpha=6, use_rslora=True),
    }
    for name, model in merged.items():
        save_tiny(model, root / f"merged_{name}")
    llm = LLM(root / "base", lora_modules={"a": str(root / "a"), "b": str(root / "b")}, max_context=256)
    return root, llm


def greedy(llm, adapter=None, prompts=PROMPTS, n=8):
    params = SamplingParams(max_tokens=n, temperature=0, logprobs=0, ignore_eos=True, adapter=adapter)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    return [(o.token_ids, [lp[t] for t, lp in zip(o.token_ids, o.logprobs)]) for o in outs]


def assert_same(got, want):
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, want):
        assert tokens == ref_tokens
        assert logprobs == pytest.approx(ref_logprobs, abs=1e-4)


@pytest.mark.parametrize("adapter", ["a", "b"])
def test_adapter_matches_the_merged_model(fixture, adapter):
    root, llm = fixture
    reference = LLM(root / f"merged_{adapter}", max_context=256)
    want = greedy(reference)
    assert_same(greedy(llm, adapter), want)
    assert [t for t, _ in greedy(llm)] != [t for t, _ in want]  # the adapter changes the output


def test_mixed_batch_runs_each_request_with_its_own_adapter(fixture):
    root, llm = fixture
    alone = {name: greedy(llm, name) for name in (None, "a", "b")}
    prompts, params = [], []
    for name in (None, "a", "b", "a"):
        for p in PROMPTS:
            prompts.append(p)
            params.append(
                SamplingParams(max_tokens=8, temperature=0, logprobs=0, ignore_eos=True, adapter=name)
            )
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    got = [(o.token_ids, [lp[t] for t, lp in zip(o.token_ids, o.logprobs)]) for o in outs]
    want = [x for name in (None, "a", "b", "a") for x in alone[name]]
    assert_same(got, want)


def test_prefix_cache_keeps_each_adapters_pages_apart(fixture):
    root, llm = fixture
    # three full pages and a bit (a hybrid model's hit needs the state snapshot at the third page's end),
    # which no other test runs
    long_prompt = [[200 + i % 97 for i in range(50)]]
    first = greedy(llm, "a", long_prompt)
    base = greedy(llm, None, long_prompt)
    out = llm.generate(
        prompt_token_ids=long_prompt, sampling_params=SamplingParams(max_tokens=1, adapter="b")
    )
    assert out[0].num_cached_tokens == 0  # neither the base model's pages nor adapter a's
    again = llm.generate(
        prompt_token_ids=long_prompt, sampling_params=SamplingParams(max_tokens=1, adapter="a")
    )
    assert again[0].num_cached_tokens > 0
    assert_same(greedy(llm, "a", long_prompt), first)  # from the cached pages: the same output
    assert_same(greedy(llm, None, long_prompt), base)


def test_weighted_mix_matches_the_scaled_merge(fixture):
    """llama.cpp's mix: 0.5 x adapter a + 1.5 x adapter b (deltas scaled and summed) is the base weights plus
    the merged models' differences so scaled; beside requests without it, with its own prefix-cache pages."""
    from safetensors.torch import load_file, save_file

    root, llm = fixture
    mix = {"a": 0.5, "b": 1.5}
    base = load_file(root / "base" / "model.safetensors")
    deltas = {n: load_file(root / f"merged_{n}" / "model.safetensors") for n in mix}
    weights = {k: v + sum(s * (deltas[n][k] - v) for n, s in mix.items()) for k, v in base.items()}
    ref_dir = root / "merged_mix"
    if not ref_dir.exists():
        ref_dir.mkdir()
        (ref_dir / "config.json").write_text((root / "base" / "config.json").read_text())
        save_file(weights, ref_dir / "model.safetensors", metadata={"format": "pt"})
    want = greedy(LLM(ref_dir, max_context=256))

    def run(scales, prompts=PROMPTS):
        params = SamplingParams(
            max_tokens=8, temperature=0, logprobs=0, ignore_eos=True, adapter_scales=scales
        )
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        return [(o.token_ids, [lp[t] for t, lp in zip(o.token_ids, o.logprobs)]) for o in outs]

    assert_same(run(mix), want)
    # a scale of 0 leaves the adapter out; {"a": 1} is adapter a
    assert_same(run({"a": 1.0, "b": 0}), greedy(llm, "a"))
    # the same prompt under another mix, or the plain adapter, finds no pages of this mix
    long_prompt = [[300 + i % 89 for i in range(50)]]
    run(mix, long_prompt)
    other = llm.generate(
        prompt_token_ids=long_prompt,
        sampling_params=SamplingParams(max_tokens=1, adapter_scales={"a": 0.5, "b": 1.0}),
    )
    assert other[0].num_cached_tokens == 0
    again = llm.generate(
        prompt_token_ids=long_prompt, sampling_params=SamplingParams(max_tokens=1, adapter_scales=mix)
    )
    assert again[0].num_cached_tokens > 0


def test_adapter_scales_refusals(fixture):
    _, llm = fixture
    with pytest.raises(NinferError, match="not both"):
        SamplingParams(adapter="a", adapter_scales={"b": 1.0})
    with pytest.raises(NinferError, match="finite scales"):
        SamplingParams(adapter_scales={"a": float("nan")})
    with pytest.raises(NinferError, match="finite scales"):
        SamplingParams(adapter_scales={"a": "1"})
    with pytest.raises(NinferError, match="no LoRA adapter 'c' is loaded"):
        llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=SamplingParams(adapter_scales={"c": 1}))


def test_adapters_in_graph_steps_through_the_buffers(fixture):
    """With CUDA graphs the adapters loaded at start-up are lanes of a second set of graphs (each row
    weighted by its scale for each lane): decode steps of a batch mixing the base model, each adapter and a
    weighted mix go through the graph path (run eagerly here, through its static buffers) and give the eager
    path's tokens; steps of base-model requests alone take the graphs without the lanes. An adapter loaded
    later runs its steps eagerly; one unloaded leaves zeros in its lane."""
    from conftest import eager_replays

    from engine.worker.cuda_graphs import DecodeGraphs

    root, _ = fixture
    options = dict(lora_modules={"a": str(root / "a"), "b": str(root / "b")}, max_context=256)
    runs = [None, "a", "b", {"a": 0.5, "b": 1.5}]

    def params(run):
        pick = {"adapter_scales": run} if isinstance(run, dict) else {"adapter": run}
        return SamplingParams(max_tokens=8, temperature=0, logprobs=0, ignore_eos=True, **pick)

    def generate(llm, runs):
        outs = llm.generate(
            prompt_token_ids=[PROMPTS[0]] * len(runs), sampling_params=[params(r) for r in runs]
        )
        return [(o.token_ids, [lp[t] for t, lp in zip(o.token_ids, o.logprobs)]) for o in outs]

    want = generate(LLM(root / "base", **options), runs)
    llm = LLM(root / "base", **options)
    graphs = DecodeGraphs(
        llm.model, 4, 256 // llm.engine_config.block_size, torch.device("cpu"), lora_lanes=2
    )
    llm.runner.graphs = eager_replays(graphs)
    llm.adapters.graph_lanes = 2
    lanes_used = []
    run_eager = graphs.run_eager
    graphs.run_eager = lambda n, q=1, lora=False: lanes_used.append(lora) or run_eager(n, q, lora)
    assert_same(generate(llm, runs), want)
    assert graphs.replays >= 7 and set(lanes_used) == {True}  # every decode step of the batch, with lanes
    lanes_used.clear()
    assert_same(generate(llm, [None, None]), [want[0], want[0]])
    assert len(lanes_used) >= 7 and set(lanes_used) == {False}  # base requests alone: no lanes' products
    assert (
        graphs._context(2, 1, False).lora_lanes is None and graphs._context(2, 1, True).lora_lanes is not None
    )
    # a third adapter, loaded now: not a lane, so the steps that run it are eager
    llm.load_adapter("c", str(root / "b"))  # the same weights as b, under a new name and slot
    before = graphs.replays
    assert_same(generate(llm, ["c"]), generate(llm, ["b"])[:1])
    assert graphs.replays - before == 7  # only b's run replayed (7 decode steps after the prompt's)
    # unloading a lane's adapter zeroes it in place (the graphs read it): the others keep their output
    llm.unload_adapter("a")
    assert_same(generate(llm, [None, "b"]), [want[0], want[2]])


def test_an_adapter_the_memory_does_not_hold_is_refused_and_leaves_the_layers_as_they_were(
    fixture, monkeypatch
):
    """The device out of memory half-way through an adapter's layers (while serving, the KV pool holds what
    the weights left): refused in a sentence, none of its pairs left on the layers (nor a layer's new
    holder of them), the loaded adapters' output unchanged, and the next load goes through."""
    from engine.lora.layer import LoraWeights

    root, llm = fixture
    want = greedy(llm, "a")

    def holders():
        return {n: sorted(m.lora.pairs) for n, m in llm.model.named_modules() if getattr(m, "lora", None)}

    before = holders()
    add_adapter, calls = LoraWeights.add_adapter, [0]

    def out_of_memory_at_the_third(self, *args):
        calls[0] += 1
        if calls[0] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        add_adapter(self, *args)

    monkeypatch.setattr(LoraWeights, "add_adapter", out_of_memory_at_the_third)
    with pytest.raises(
        NinferError,
        match=r"LoRA adapter 'big' takes [\d.,]+ MiB, more than the [\d,]+ MiB free "
        r"on cpu: the KV pool holds the rest: load it at start-up \(serve --lora NAME=PATH",
    ):
        llm.load_adapter("big", str(root / "a"))
    assert calls[0] == 3 and holders() == before and llm.adapters.names == ["a", "b"]
    assert_same(greedy(llm, "a"), want)
    monkeypatch.undo()
    llm.load_adapter("big", str(root / "a"))  # (the same weights as a)
    assert_same(greedy(llm, "big"), want)
    llm.unload_adapter("big")
    # at start-up the adapters load before the pool is sized: the weights hold the rest
    monkeypatch.setattr(LoraWeights, "add_adapter", out_of_memory_at_the_third)
    calls[0] = 2
    with pytest.raises(
        NinferError, match="LoRA adapter 'a' takes .* the weights hold the rest: an adapter of lower"
    ):
        LLM(root / "base", lora_modules={"a": str(root / "a")}, max_context=256)


def test_unknown_adapter_is_refused(fixture):
    _, llm = fixture
    with pytest.raises(NinferError, match="no LoRA adapter 'c' is loaded; the adapters are: a, b"):
        llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=SamplingParams(adapter="c"))


def test_adapter_refusals(tmp_path):
    base = tiny_hf_model("qwen3", tied=False, seed=3)
    save_tiny(base, tmp_path / "base")

    def refused(path, match, **options):
        with pytest.raises(NinferError, match=match):
            LLM(tmp_path / "base", lora_modules={"x": str(path)}, max_context=64, **options)

    refused(tmp_path / "nowhere", "is not a folder")
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", "has no adapter_config.json")
    make_adapter(base, ["embed_tokens", "q_proj"], tmp_path / "embed", seed=1)
    refused(tmp_path / "embed", "changes model.embed_tokens; ninfer applies LoRA to the decoder layers'")
    make_adapter(base, ["q_proj"], tmp_path / "saved", seed=1, modules_to_save=["lm_head"])
    refused(tmp_path / "saved", "which is not a LoRA matrix")
    make_adapter(base, ["q_proj"], tmp_path / "dora", seed=1, use_dora=True)
    refused(tmp_path / "dora", "uses DoRA")
    # a Qwen3 adapter on a Qwen3.5, whose layer 0 is linear attention (no self_attn.q_proj)
    save_tiny(tiny_hf_model("qwen3_5", tied=False, seed=3), tmp_path / "hybrid")
    make_adapter(base, ["q_proj"], tmp_path / "q", seed=1)
    with pytest.raises(
        NinferError, match="changes model.layers.0.self_attn.q_proj, which this model does not"
    ):
        LLM(tmp_path / "hybrid", lora_modules={"x": str(tmp_path / "q")}, max_context=64)
    other = tiny_hf_model("qwen3", tied=False, seed=3, intermediate_size=48)
    make_adapter(other, ["down_proj"], tmp_path / "other", seed=1)
    refused(tmp_path / "other", "maps 48 -> 64 features, but this model.s takes 128 -> 64")
    make_adapter(base, ["q_proj"], tmp_path / "ok", seed=1)
    config = json.loads((tmp_path / "ok" / "adapter_config.json").read_text())
    (tmp_path / "ok" / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    refused(tmp_path / "ok", "is a IA3 adapter; ninfer runs LoRA adapters")


@pytest.mark.parametrize(
    "value, match",
    [
        ("a=", "--lora takes NAME=PATH"),
        (["a=/tmp", "a=/tmp"], "'a' is given twice"),
        ({"bad name": "/tmp"}, "is not a model name"),
    ],
)
def test_lora_modules_flag_values_are_checked(value, match):
    from engine.config import EngineConfig

    with pytest.raises(NinferError, match=match):
        EngineConfig(model="", lora_modules=value)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_adapters_on_cuda_with_graphs_match_the_cpu(arch, tmp_path):
    """On the GPU the adapter loaded at start-up is a lane of the decode graphs, an adapter loaded later runs
    its steps eagerly beside them: batches of base and adapter requests, and a weighted mix, give the CPU's
    tokens (fp32 both)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    base = tiny_hf_model(arch, tied=False, seed=3)
    save_tiny(base, tmp_path / "base")
    shapes = {"mlp.down_proj": (128, 64), "mlp.up_proj": (64, 128)}
    adapter = write_lora_adapter(tmp_path / "a", shapes, base.config.num_hidden_layers, scale=0.5)
    outs = {}
    for device in ("cpu", "cuda"):
        llm = LLM(
            tmp_path / "base",
            device=device,
            dtype="float32",
            lora_modules={"a": str(adapter)},
            max_context=256,
        )
        llm.load_adapter("late", str(adapter))
        if device == "cuda":
            assert llm.runner.graphs is not None and llm.adapters.graph_lanes == 1
        mix = SamplingParams(
            max_tokens=12, temperature=0, ignore_eos=True, adapter_scales={"a": 0.5, "late": 1}
        )
        outs[device] = (
            [[t for t, _ in greedy(llm, name, n=12)] for name in (None, "a", "late")]
            + [llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=mix)[0].token_ids]
            + [
                o.token_ids
                for o in llm.generate(
                    prompt_token_ids=PROMPTS * 2,
                    sampling_params=[
                        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, adapter=name)
                        for name in (None, None, "a", "a")
                    ],
                )
            ]
        )
    assert outs["cuda"] == outs["cpu"]
    assert outs["cpu"][0] != outs["cpu"][1]  # the adapter changes the output


@pytest.mark.parametrize("spec", ["ngram", "mtp"])
def test_adapters_with_speculative_decoding_keep_their_tokens(spec, tmp_path):
    """Drafts (n-gram, or the MTP head, which has no adapter) are verified by the model with the adapter:
    the adapter's greedy tokens are those without speculative decoding."""
    from conftest import mtp_head_tensors, save_mtp_head

    base = tiny_hf_model("qwen3_5", tied=False, seed=3)
    save_tiny(base, tmp_path / "base")
    save_mtp_head(tmp_path / "base", mtp_head_tensors(base))
    shapes = {"mlp.down_proj": (128, 64), "mlp.up_proj": (64, 128)}
    adapter = write_lora_adapter(tmp_path / "a", shapes, base.config.num_hidden_layers, scale=0.5)
    prompts = [PROMPTS[1] * 2, PROMPTS[0] * 3]  # repeats, so that n-grams draft
    runs = {}
    for name, options in (("plain", {}), ("spec", {"spec": spec, "draft_tokens": 3})):
        llm = LLM(tmp_path / "base", lora_modules={"a": str(adapter)}, max_context=256, **options)
        params = [
            SamplingParams(max_tokens=48, temperature=0, ignore_eos=True, adapter=a) for a in ("a", None)
        ]
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        runs[name] = [o.token_ids for o in outs]
        drafted = sum(o.num_draft_tokens for o in outs)
    assert runs["spec"] == runs["plain"]
    assert drafted > 0


def gguf_adapter(peft_dir, path, arch: str, config, alpha: float):
    """The peft adapter as llama.cpp's convert_lora_to_gguf.py writes it: the base GGUF's tensor names (the
    gguf package's map) + .lora_a / .lora_b, and for llama q's and k's B rows interleaved as its converter
    interleaves the base weights'."""
    import gguf
    from safetensors.torch import load_file

    names = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), config.num_hidden_layers
    )
    from test_gguf_qwen35 import _as_converted

    def permute(w, heads):  # llama.cpp's LlamaModel.permute
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for key, tensor in sorted(load_file(peft_dir / "adapter_model.safetensors").items()):
        module, half = key.removeprefix("base_model.model.").rsplit(".lora_", 1)
        if arch == "llama" and half.startswith("B") and module.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if module.endswith("q_proj") else config.num_key_value_heads
            tensor = permute(tensor, heads)
        # qwen35: the value heads' rows in tiled order (B), and out_proj's columns (A), as the base weights'
        if (
            arch == "qwen35"
            and ".linear_attn." in module
            and half.startswith("A") == module.endswith("out_proj")
        ):
            tensor = _as_converted(module + ".weight", tensor, config)[1]
        name = names.get_name(module + ".weight", try_suffixes=(".weight",))
        writer.add_tensor(f"{name}.lora_{half[0].lower()}", tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_gguf_adapter_runs_as_its_peft_folder(arch, tmp_path):
    base = tiny_hf_model(arch, tied=False, seed=3)
    save_tiny(base, tmp_path / "base")
    make_adapter(base, TARGETS["qwen3"], tmp_path / "peft", seed=1, r=4, alpha=8)
    path = gguf_adapter(tmp_path / "peft", tmp_path / "lora.gguf", arch, base.config, alpha=8)
    llm = LLM(tmp_path / "base", lora_modules=[f"peft={tmp_path / 'peft'}", str(path)], max_context=256)
    assert llm.adapters.names == ["peft", "lora"]  # a bare .gguf is named after its file
    assert_same(greedy(llm, "lora"), greedy(llm, "peft"))
    assert [t for t, _ in greedy(llm, "lora")] != [t for t, _ in greedy(llm)]
    # a model GGUF is not an adapter
    from engine.models.loader import default_model_path

    with pytest.raises(NinferError, match="is a model, not an adapter; give a LoRA adapter GGUF"):
        llm.load_adapter("m", str(default_model_path()))


def test_a_qwen35_gguf_adapter_runs_as_its_peft_folder(tmp_path):
    """A Qwen3.5 adapter GGUF: the full attention's and MLP's factors as named, the linear attention's with
    the value heads in the converter's tiled order (B's rows; out_proj's A columns), read back grouped."""
    base = tiny_hf_model("qwen3_5", tied=False, seed=3)
    save_tiny(base, tmp_path / "base")
    make_adapter(base, TARGETS["qwen3_5"], tmp_path / "peft", seed=1, r=4, alpha=8)
    path = gguf_adapter(tmp_path / "peft", tmp_path / "lora.gguf", "qwen35", base.config, alpha=8)
    llm = LLM(tmp_path / "base", lora_modules=[f"peft={tmp_path / 'peft'}", f"gguf={path}"], max_context=256)
    assert_same(greedy(llm, "gguf"), greedy(llm, "peft"))
    assert [t for t, _ in greedy(llm, "gguf")] != [t for t, _ in greedy(llm)]
