"""The VRAM ledger (engine/memory.py) and its solver: bytes equal what the engine allocates, field sanity on
presets, refusals whose suggestions fit, serve-time sizing refused before allocation."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

from engine import LLM, NinferError
from engine.layers.attention import Attention
from engine.layers.gated_deltanet import GatedDeltaNet
from engine.memory import GIB, KV_POOL, Deployment, ledger
from engine.plan import runtime
from engine.plan.model import resolve
from engine.plan.presets import PRESETS, preset
from engine.plan.solver import Budget, Device, PlanRefusal, fits, frontier, max_context, needed, solve
from engine.plan.weights import recipe_weight_bytes
from engine.quant.groupwise import quantize, stored_nbytes
from ninfer_kernels.quant_matmul import DEQUANT_MIN_M, DEQUANT_SCRATCH_BYTES

KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "k8v4")
RTX_3090 = Device("RTX 3090", 24 * GIB, (8, 6))


@pytest.fixture(scope="module", params=["llama", "qwen3_5"])
def tiny_dir(request, tmp_path_factory):
    return save_tiny(
        tiny_hf_model(request.param, tied=False, head_dim=32), tmp_path_factory.mktemp(request.param)
    )


def _allocated(llm) -> tuple[int, int]:
    kv = state = 0
    for m in llm.model.modules():
        if isinstance(m, Attention):
            kv += m.kv_cache.num_bytes
        elif isinstance(m, GatedDeltaNet):
            state += m.conv_state.numel() * m.conv_state.element_size()
            state += m.ssm_state.numel() * m.ssm_state.element_size()
    return kv, state


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_ledger_kv_and_state_bytes_equal_the_allocated_tensors(tiny_dir, kv_dtype):
    llm = LLM(
        tiny_dir, kv_dtype=kv_dtype, max_context=200, kv_capacity=333, max_concurrency=3, dtype="bfloat16"
    )
    cfg = llm.engine_config
    dep = Deployment(
        llm.model_config,
        cfg.kv_dtype,
        llm.max_context,
        concurrency=cfg.max_concurrency,
        kv_capacity=cfg.kv_capacity,
        state_snapshots=cfg.num_state_snapshots,
        dtype_bytes=2,
        device="cpu",
    )
    rows = ledger(dep, 24 * GIB)
    kv, state = _allocated(llm)
    assert rows.get(KV_POOL) == kv > 0
    assert rows.get("recurrent state") + rows.get("state snapshots") == state
    assert (state > 0) == (llm.model_config.num_linear_attention_layers > 0)


def test_stored_nbytes_matches_quantize():
    for shape, bits in [((48, 576), 4), ((40, 200), 6), ((33, 256), 8), ((16, 96), 4)]:
        assert stored_nbytes(shape, bits) == quantize(torch.randn(shape), bits).nbytes


def _dep(name="qwen3.5-27b", kv="k8v4", concurrency=2, spec="mtp", vision=False, **kw):
    p = preset(name)
    weights = recipe_weight_bytes(p.config, p.recipe, mtp=spec == "mtp", vision=vision)
    return Deployment(
        p.config,
        kv,
        p.config.max_position_embeddings,
        concurrency=concurrency,
        weights=weights,
        spec=spec,
        draft_tokens=3 if spec != "none" else 0,
        vision=vision,
        packed_weights=p.recipe != "bf16",
        **kw,
    )


def test_field_sanity_qwen35_27b_on_24_gib():
    budget = Budget.whole(RTX_3090)
    k8v4 = max_context(_dep(), budget)
    assert k8v4 >= 170_000
    assert max_context(_dep(kv="int8"), budget) < k8v4
    assert max_context(_dep(vision=True), budget) < k8v4
    assert max_context(_dep(concurrency=3), budget) < k8v4
    best = solve(_dep(), RTX_3090, 170_000, None)
    assert best.context == 170_000 and fits(best, budget)


def test_dequant_scratch_is_reserved_where_long_chunks_dequantize():
    """Packed weights on a GPU with prefill chunks of DEQUANT_MIN_M+ tokens: kernels/quant_matmul keeps a
    scratch of DEQUANT_SCRATCH_BYTES for the dequantized weight slices, a ledger row of its own. Not for
    dense weights, the CPU (weights dequantized at load), or chunks that all take the fused GEMM."""
    packed = _dep()
    assert packed.packed_weights and ledger(packed, 24 * GIB).get("dequant scratch") == DEQUANT_SCRATCH_BYTES
    for dep in (
        packed.with_(packed_weights=False),
        packed.with_(device="cpu"),
        packed.with_(prefill_chunk=DEQUANT_MIN_M - 1),
    ):
        assert ledger(dep, 24 * GIB).get("dequant scratch") == 0
    assert resolve(None, "qwen3.5-27b", None, None, False, False).packed_weights  # q4.6
    assert not resolve(None, "qwen3.5-27b", "bf16", None, False, False).packed_weights
    assert resolve(None, "qwen3.5-27b", "bf16", 4.5, False, False).packed_weights


def test_lora_adapters_double_the_decode_graphs():
    """With LoRA adapters at start-up the decode graphs are captured with and without their lanes: the
    graph row counts each (bucket, query count) twice, the MTP head's chained steps once."""
    from engine.memory import GRAPH_OVERHEAD_BYTES, graph_buckets

    dep = _dep().with_(spec="mtp", draft_tokens=3, concurrency=2)
    plain, lanes = (ledger(d, 24 * GIB) for d in (dep, dep.with_(lora_graphs=True)))
    extra = len(graph_buckets(2)) * dep.decode_tokens * GRAPH_OVERHEAD_BYTES
    assert lanes.get("CUDA graph pools") - plain.get("CUDA graph pools") == extra


def test_fp8_refused_on_sm86_with_the_reason():
    table = frontier(_dep(), RTX_3090)
    assert all("compute capability 8.9" in str(v) for v in table["fp8"].values())
    with pytest.raises(NinferError, match="fp8 KV needs compute capability 8.9.*SM86"):
        solve(_dep(), RTX_3090, None, "fp8")
    h200 = Device("H200", 141 * GIB, (9, 0))
    assert isinstance(frontier(_dep(), h200)["fp8"][1], int)


@pytest.mark.parametrize(
    "kv, concurrency, context",
    [("int8", 2, 230_000), ("bf16", 4, 150_000), ("k8v4", 3, 262_144), ("bf16", 1, 120_000)],
)
def test_refusal_gives_three_suggestions_that_each_fit(kv, concurrency, context):
    dep = _dep(kv=kv, concurrency=concurrency)
    with pytest.raises(PlanRefusal) as e:
        solve(dep, RTX_3090, context, kv)
    assert "GiB" in str(e.value) and f"{context:,}" in str(e.value)
    ways = e.value.suggestions
    assert len(ways) == 3, [s.text for s in ways]
    for s in ways:
        d = s.deployment
        got = solve(d, RTX_3090, d.context, d.kv_dtype)  # fed back: no refusal
        assert got.context == d.context and fits(got, Budget.whole(RTX_3090)), s.text


def test_every_preset_plans():
    for name in PRESETS:
        p = resolve(None, name, None, None, mtp=False, vision=False)
        dep = Deployment(p.config, "bf16", 4096, weights=p.weights, packed_weights=p.packed_weights)
        best = solve(dep, Device("H200", 141 * GIB, (9, 0)), None, None)
        assert best.context > 0


def test_a_kv_pool_smaller_than_the_context_sets_the_context_or_is_refused(tiny_dir, caplog):
    """--kv-capacity below the context: without --max-context the context is what the pool holds (said in
    the log), so a prompt past it gets the context error clients know; with one, refused in one line."""
    with caplog.at_level("INFO", logger="ninfer"):
        llm = LLM(tiny_dir, kv_capacity=50)  # 4 pages of 16
    assert llm.max_context == 64 < llm.model_config.position_limit
    assert "max context 64 (what --kv-capacity holds" in caplog.text
    with pytest.raises(NinferError) as e:
        LLM(tiny_dir, kv_capacity=64, max_context=128)
    assert str(e.value) == (
        "--kv-capacity 64 holds fewer tokens than --max-context 128, so a request as long as the context could "
        "never run; raise --kv-capacity to 128 or more (ninfer plan shows what fits), or lower --max-context to 64"
    )


def test_serve_auto_fills_free_memory_and_refuses_what_does_not_fit(tiny_dir, monkeypatch):
    gib = GIB
    monkeypatch.setattr(runtime, "device_memory", lambda device: (64 * gib, 4 * gib))
    llm = LLM(tiny_dir, kv_capacity=4096, max_context=512)
    assert llm.runner.kv_cache_bytes > 0
    # 2 GiB free with a 1.28 GiB safety margin: a 10M-token pool does not fit; refused before allocating
    monkeypatch.setattr(runtime, "device_memory", lambda device: (64 * gib, 2 * gib))
    with pytest.raises(
        NinferError, match=r"does not fit.*Ways out: a smaller KV pool: --kv-capacity (\d+)"
    ) as e:
        LLM(tiny_dir, kv_capacity=10_000_000, max_context=512, max_concurrency=2)
    ways = str(e.value).split("Ways out: ")[1].split("; ")
    assert len(ways) == 3 and "--kv-dtype" in ways[1] + ways[2], ways
    flags = {
        "--kv-capacity": "kv_capacity",
        "--max-concurrency": "max_concurrency",
        "--kv-dtype": "kv_dtype",
        "--prefill-chunk": "prefill_chunk",
    }
    for way in ways:  # every suggestion, taken, starts
        words = way.split(": ")[1].split()
        options = {flags[f]: (v if f == "--kv-dtype" else int(v)) for f, v in zip(words[::2], words[1::2])}
        LLM(tiny_dir, **{"kv_capacity": 10_000_000, "max_context": 512, "max_concurrency": 2, **options})


def test_serve_auto_on_cuda_sizes_the_pool_from_free_memory(tiny_dir, monkeypatch):
    from engine.config import EngineConfig

    monkeypatch.setattr(runtime, "device_memory", lambda device: (8 * GIB, 1 * GIB))
    llm = LLM(tiny_dir)
    config = EngineConfig(model="", device="cuda", kv_capacity="auto", max_concurrency=2, kv_dtype="bf16")
    context, pool = runtime.size_kv_pool(config, llm.model_config)
    assert context == llm.model_config.max_position_embeddings  # the tiny model: the pool holds it all
    assert pool == context * 2  # capped at every running request at full context
    # room for 96 tokens beside the reserves: the context becomes what the pool holds, and says so
    dep = runtime.deployment(config, llm.model_config, 1024)
    budget = Budget.after_load(8 * GIB, 0)
    free = needed(dep.with_(kv_capacity=96), budget)
    monkeypatch.setattr(runtime, "device_memory", lambda device: (8 * GIB, free))
    assert runtime.size_kv_pool(config, llm.model_config) == (96, 96)  # whole pages of 16
    monkeypatch.setattr(runtime, "device_memory", lambda device: (8 * GIB, 200 * (1 << 20)))
    with pytest.raises(NinferError, match="does not fit"):
        runtime.size_kv_pool(config, llm.model_config)
    # an explicit --max-context the pool cannot hold is refused, not shrunk
    monkeypatch.setattr(runtime, "device_memory", lambda device: (8 * GIB, free))
    with pytest.raises(NinferError, match="--kv-capacity 96"):
        runtime.size_kv_pool(
            EngineConfig(
                model="",
                device="cuda",
                kv_capacity="auto",
                max_concurrency=2,
                kv_dtype="bf16",
                max_context=512,
            ),
            llm.model_config,
        )


def test_gpu_memory_utilization_caps_the_pool(tiny_dir, monkeypatch):
    """--gpu-memory-utilization: the pool fits within that share of the device, less what the engine holds
    (weights, CUDA context), and never beyond what is free."""
    from engine.config import EngineConfig
    from engine.memory import CUDA_CONTEXT_BYTES, LIBRARY_WORKSPACE_BYTES

    assert runtime.within_utilization(100, 80, 20, 0.5) == 30
    assert runtime.within_utilization(100, 10, 20, 0.5) == 10  # another process holds the rest
    assert runtime.within_utilization(100, 80, 60, 0.5) == 0
    llm = LLM(tiny_dir)
    held = 1 * GIB  # the weights, as torch holds them
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: held)
    config = dict(
        model="", device="cuda", kv_capacity="auto", max_concurrency=1, kv_dtype="bf16", max_context=1024
    )
    dep = runtime.deployment(EngineConfig(**config), llm.model_config, 1024)
    room = needed(dep.with_(kv_capacity=512), Budget.after_load(8 * GIB, 0))  # what a 512-token pool takes
    # the device has plenty free, but the share is the weights, the context and those 512 tokens' worth
    share = (held + CUDA_CONTEXT_BYTES + LIBRARY_WORKSPACE_BYTES + room) / (8 * GIB)
    monkeypatch.setattr(runtime, "device_memory", lambda device: (8 * GIB, 6 * GIB))
    capped = EngineConfig(**{**config, "max_context": None}, gpu_memory_utilization=share + 1e-9)
    assert runtime.size_kv_pool(capped, llm.model_config) == (512, 512)
    with pytest.raises(NinferError, match=r"is free after the weights within --gpu-memory-utilization 0\.1,"):
        runtime.size_kv_pool(EngineConfig(**config, gpu_memory_utilization=0.1), llm.model_config)
    for bad in (0, 1.5, "0.9", True):
        with pytest.raises(NinferError, match="gpu_memory_utilization is a fraction"):
            EngineConfig(model="", gpu_memory_utilization=bad)
