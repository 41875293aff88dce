"""`ninfer plan` at the CLI: ledger + frontier + serve line, JSON, refusals with ways out, every MODEL form."""

from __future__ import annotations

import json

import pytest
from conftest import save_tiny, tiny_hf_model
from typer.testing import CliRunner

from engine.quant.convert import convert
from ninfer_cli.main import app

runner = CliRunner()


def _run(*args):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def _plan_27b_3090(*args: str):
    return _run("plan", "qwen3.5-27b", "--vram", "24G", "--sm", "86", *args)


def test_preset_plan_prints_ledger_frontier_and_a_serve_line():
    flags = (
        "--model qwen3.5-27b --vram 24G --sm 86 --concurrency 2 --kv-dtype k8v4 --spec mtp --draft-tokens 3"
    )
    code, out = _run("plan", *flags.split())
    assert code == 0, out
    for part in (
        "weights: mlp",
        "KV pool",
        "recurrent state",
        "state snapshots",
        "draft buffers",
        "activations",
        "CUDA context",
        "CUDA graph pools",
        "safety margin",
        "frontier",
        "excluded: fp8 KV needs",
    ):
        assert part in out, part
    line = next(ln for ln in out.splitlines() if ln.startswith("ninfer serve"))
    assert (
        "--kv-dtype k8v4 --prefill-chunk 2048 --spec mtp --draft-tokens 3" in line
        and "--max-concurrency 2" in line
    )
    context = int(line.split("--max-context ")[1].split()[0])
    assert context >= 170_000


def _served(out: str, flag: str) -> int:
    line = next(ln for ln in out.splitlines() if ln.startswith("ninfer serve"))
    return int(line.split(f"{flag} ")[1].split()[0])


def test_the_serve_lines_pool_takes_the_memory_the_context_leaves():
    """Where the context stops at the model's positions (32 GiB: 262,144 at C2), the pool grows into the
    memory left, up to a full context a running request, as serve's --kv-capacity auto sizes it; where
    memory stops the context (24 GiB), the pool is the context and nothing is left."""
    code, out = _run("plan", "qwen3.5-27b", "--vram", "32G", "--sm", "120", "--concurrency", "2", "--json")
    assert code == 0, out
    plan = json.loads(out)["plan"]
    assert plan["context"] == 262_144 and plan["kv_capacity"] == 2 * 262_144
    assert _served(plan["serve"], "--kv-capacity") == 2 * 262_144
    code, out = _run("plan", "qwen3.5-27b", "--vram", "32G", "--sm", "120", "--concurrency", "2")
    assert "524,288 tokens x" in out
    code, tight = _plan_27b_3090("--concurrency", "2", "--spec", "mtp", "--draft-tokens", "3")
    assert code == 0, tight
    assert _served(tight, "--kv-capacity") == _served(tight, "--max-context") < 262_144
    # 24 GiB without the MTP head: the positions stop the context first, the pool grows past it
    code, out = _plan_27b_3090("--concurrency", "2")
    assert _served(out, "--max-context") == 262_144 < _served(out, "--kv-capacity") < 2 * 262_144
    # a given context shorter than memory allows: a full one for each of the running requests, no more
    code, given = _run(
        "plan", "qwen3.5-27b", "--vram", "32G", "--sm", "120", "--concurrency", "3", "--context", "64k"
    )
    assert code == 0, given
    assert _served(given, "--max-context") == 65_536 and _served(given, "--kv-capacity") == 3 * 65_536


def test_a_pool_short_of_every_running_context_serves_with_a_host_tier_for_the_rest():
    """24 GiB, C2 at 180K: the pool holds 291,920 of the 368,640 tokens two full contexts take, so one
    agent's turn evicts the other's cached prefix; the serve line keeps those pages in a host tier of the
    shortfall's KV bytes plus the default host state snapshots (kept as many with the flag given). Where
    the pool holds every context (32 GiB), or one request runs, none."""
    from engine.sizes import parse_size

    code, out = _plan_27b_3090("--concurrency", "2", "--context", "180k", "--json")
    assert code == 0, out
    plan = json.loads(out)["plan"]
    assert plan["kv_capacity"] == 291_920 and plan["context"] == 184_320
    host = plan["host_cache"]
    assert host["kv_tokens"] == 2 * 184_320 - 291_920 and host["kv_bytes"] == host["kv_tokens"] * 25_728
    snapshots = plan["host_state_snapshots"]
    assert snapshots["count"] == 18
    assert host["bytes"] == 4.5 * 2**30 >= host["kv_bytes"] + snapshots["bytes"] > 4.25 * 2**30
    assert plan["serve"].endswith(" --host-cache 4.5G --host-state-snapshots 18")
    assert parse_size("4.5G", "--host-cache") == host["bytes"]
    code, out = _plan_27b_3090("--concurrency", "2", "--context", "180k")
    assert "the pool holds 291,920 of the 368,640 tokens 2 requests take at full context" in " ".join(
        out.split()
    )
    # a dense model: no snapshots to keep
    code, out = _run("plan", "qwen3-32b", "--vram", "24G", "--sm", "86", "--concurrency", "2", "--json")
    plan = json.loads(out)["plan"]
    assert plan["host_cache"]["kv_tokens"] == 2 * plan["context"] - plan["kv_capacity"] > 0
    assert plan["serve"].endswith(f" --host-cache {plan['host_cache']['bytes'] / 2**30:g}G")
    for args in (("--vram", "32G", "--sm", "120", "--concurrency", "2"), ("--vram", "24G", "--sm", "86")):
        code, out = _run("plan", "qwen3.5-27b", *args, "--json")
        plan = json.loads(out)["plan"]
        assert plan["host_cache"] == {"bytes": 0, "kv_tokens": 0, "kv_bytes": 0}
        assert "--host-cache" not in plan["serve"]


def test_ngram_plan_budgets_state_backups_and_serves_with_drafts():
    code, out = _plan_27b_3090("--concurrency", "2", "--spec", "ngram")
    assert code == 0, out
    assert "ngram: 2 x the state before a step" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("ninfer serve"))
    assert "--prefill-chunk 2048 --spec ngram --draft-tokens 3" in line
    assert "serve does not run" not in out


def test_state_snapshots_are_budgeted_and_serve_with_the_flag():
    """--state-snapshots: the ledger's snapshot row is that many states (default 2 x concurrency + 2), the
    serve line carries it, and the context shrinks by their memory."""
    code, default = _plan_27b_3090("--concurrency", "1", "--context", "128k")
    assert code == 0, default
    code, out = _plan_27b_3090("--concurrency", "1", "--context", "128k", "--state-snapshots", "8")
    assert code == 0, out
    assert "4 prefix-cache snapshots" in default and "8 prefix-cache snapshots" in out

    def gib(text: str) -> float:
        return float(next(ln for ln in text.splitlines() if "state snapshots" in ln).split("│")[2])

    assert gib(out) == pytest.approx(2 * gib(default), rel=0.01)
    line = next(ln for ln in out.splitlines() if ln.startswith("ninfer serve"))
    assert line.endswith("--state-snapshots 8")
    assert "--state-snapshots" not in next(ln for ln in default.splitlines() if ln.startswith("ninfer serve"))
    # the host tier the evicted ones go to, three times as many, said beside the ledger (host memory)
    assert "host memory beside this ledger: 12 state snapshots" in default
    assert "host memory beside this ledger: 24 state snapshots" in out
    code, none = _plan_27b_3090("--concurrency", "1", "--context", "128k", "--state-snapshots", "0")
    assert code == 0 and "host memory beside this ledger" not in none


def test_int8_prefill_plan_budgets_the_chunks_codes_and_serves_with_the_flag():
    code, out = _plan_27b_3090("--concurrency", "2", "--int8-prefill")
    assert code == 0, out
    assert "int8 activations" in out and "17,408 columns" in out and "dequant scratch" not in out
    line = next(ln for ln in out.splitlines() if ln.startswith("ninfer serve"))
    assert "--prefill-chunk 2048 --int8-prefill" in line
    code, plain = _plan_27b_3090("--concurrency", "2")
    assert "dequant scratch" in plain and "int8 activations" not in plain


def test_moe_preset_counts_every_expert():
    """Qwen3-30B-A3B: all 128 experts of a layer are held (3B active, 30B stored), ~16 GiB at q4.6."""
    code, out = _run("plan", "--model", "qwen3-30b-a3b", "--vram", "24G", "--sm", "86", "--json")
    assert code == 0, out
    plan = json.loads(out)["plan"]
    weights = sum(r["bytes"] for r in plan["ledger"] if r["component"].startswith("weights"))
    assert 16.0 < weights / 2**30 < 17.5  # 30.5B weights at 4.6 bits, routers and vectors at 16
    assert plan["context"] >= 32768 and "--max-concurrency" in plan["serve"]
    assert plan["host_state_snapshots"] == {"count": 0, "bytes": 0}  # no recurrent state


def test_qwen3_vl_moe_preset_holds_its_tower_only_with_vision():
    """Qwen3-VL-30B-A3B: Qwen3-30B-A3B's text model (~16 GiB at q4.6), and with --vision its tower in bf16
    (~1 GiB, deepstack mergers included)."""
    rows = {}
    for flags in ((), ("--vision",)):
        code, out = _run(
            "plan", "--model", "qwen3-vl-30b-a3b", "--vram", "24G", "--sm", "86", "--json", *flags
        )
        assert code == 0, out
        rows[flags] = {r["component"]: r["bytes"] for r in json.loads(out)["plan"]["ledger"]}
    text = sum(b for c, b in rows[()].items() if c.startswith("weights"))
    assert 16.0 < text / 2**30 < 17.5 and rows[()].get("weights: vision tower", 0) == 0
    assert 0.9 < rows[("--vision",)]["weights: vision tower"] / 2**30 < 1.2


@pytest.mark.parametrize("name", ["qwen3.5-35b-a3b", "qwen3.6-35b-a3b"])
def test_qwen3_5_moe_preset_fits_a_24_gib_card_at_180k_for_two(name):
    """Qwen3.5 / Qwen3.6-35B-A3B: 256 experts a layer held (~35B weights, ~18.6 GiB at q4.6); its 10
    attention layers of 2 KV heads keep 180K at C2 on a 24 GiB card, in a few GiB of KV."""
    code, out = _run(
        "plan", "--model", name, "--vram", "24G", "--sm", "86", "--concurrency", "2", "--context", "180k"
    )
    assert code == 0, out
    code, out = _run("plan", "--model", name, "--vram", "24G", "--sm", "86", "--concurrency", "2", "--json")
    plan = json.loads(out)["plan"]
    rows = {r["component"]: r["bytes"] for r in plan["ledger"]}
    weights = sum(b for c, b in rows.items() if c.startswith("weights"))
    assert 18.0 < weights / 2**30 < 19.5 and rows["weights: experts"] > 0.9 * weights
    assert plan["context"] >= 180 * 1024 and "--max-concurrency 2" in plan["serve"]
    assert rows["KV pool"] < 4 * 2**30 and plan["host_state_snapshots"]["count"] > 0


def test_qwen3_next_preset_fits_an_80_gib_card_at_180k():
    """Qwen3-Next-80B-A3B: 512 experts a layer held (~80B weights, ~43 GiB at q4.6); its 12 attention layers
    of 2 KV heads keep 180K at C2 in a few GiB of KV."""
    code, out = _run("plan", "--model", "qwen3-next-80b-a3b", "--vram", "80G", "--sm", "90", "--json")
    assert code == 0, out
    plan = json.loads(out)["plan"]
    weights = sum(r["bytes"] for r in plan["ledger"] if r["component"].startswith("weights"))
    assert 41.0 < weights / 2**30 < 45.0
    assert plan["context"] >= 180 * 1024
    # a hybrid: its host tier, three times the GPU snapshot slots, each one state slot
    snapshots = next(r for r in plan["ledger"] if r["component"] == "state snapshots")["bytes"]
    assert (
        plan["host_state_snapshots"]["bytes"] == 3 * snapshots and plan["host_state_snapshots"]["count"] > 0
    )


def test_vision_plan_budgets_the_tower_and_serves_with_the_flag():
    """The field's ledger: the tower costs ~2 GiB on a 24 GiB card, and C2 context drops with it."""
    code, out = _plan_27b_3090("--concurrency", "2", "--kv-dtype", "k8v4", "--vision")
    assert code == 0, out
    assert "vision tower" in out and "vision activations" in out and "16384 patches" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("ninfer serve"))
    assert "--prefill-chunk 2048 --vision" in line
    with_tower = int(line.split("--max-context ")[1].split()[0])
    code, plain = _plan_27b_3090("--concurrency", "2", "--kv-dtype", "k8v4")
    line = next(ln for ln in plain.splitlines() if ln.startswith("ninfer serve"))
    assert "--vision" not in line and int(line.split("--max-context ")[1].split()[0]) > with_tower


def test_json_and_refusal_exit_2_with_three_ways_out():
    code, out = _plan_27b_3090(*["--concurrency", "2", "--context", "250k", "--kv-dtype", "int8", "--json"])
    assert code == 2
    data = json.loads(out)
    assert "256,000 tokens" in data["refusal"]["message"]
    assert len(data["refusal"]["suggestions"]) == 3
    for s in data["refusal"]["suggestions"]:  # each fed back fits
        code, out2 = _plan_27b_3090(
            "--concurrency",
            str(s["concurrency"]),
            "--context",
            str(s["context"]),
            "--kv-dtype",
            s["kv_dtype"],
            "--json",
        )
        assert code == 0, out2
        assert json.loads(out2)["plan"]["context"] == s["context"]


def test_a_target_context_without_concurrency_takes_the_most_requests_that_fit():
    code, out = _plan_27b_3090("--context", "100k", "--json")
    assert code == 0, out
    plan = json.loads(out)["plan"]
    assert plan["context"] == 102_400 and plan["concurrency"] == 4
    # int8 KV: 241,696 tokens at C1, 227,424 at C2, 213,136 at C3, 198,928 at C4 (210k = 215,040)
    code, out = _plan_27b_3090("--context", "210k", "--kv-dtype", "int8", "--json")
    assert code == 0 and json.loads(out)["plan"]["concurrency"] == 2
    code, out = _plan_27b_3090("--context", "235k", "--kv-dtype", "int8", "--json")
    assert code == 0 and json.loads(out)["plan"]["concurrency"] == 1  # only one request reaches 235K


def test_weights_past_the_gpu_offer_4_bits_only_where_they_would_fit():
    """Weights bigger than the GPU: 4-bit weights are offered (with their size) where they would leave
    room, else only a bigger GPU; the refusal names the smallest KV dtype when none holds any context."""
    code, out = _run("plan", "--model", "qwen3.5-27b", "--recipe", "bf16", "--vram", "24G")
    flat = " ".join(out.split())
    assert code == 2 and "fewer bits per weight (--recipe w4g128: 13.31 GiB, or --bits 4)" in flat, out
    code, out = _run("plan", "--model", "qwen3.5-27b", "--vram", "8G")
    flat = " ".join(out.split())
    assert code == 2 and "with k8v4 KV needs" in flat, out
    assert "even at 4 bits per weight (w4g128) they take 13.31 GiB; a bigger GPU" in flat
    assert "--recipe w4g128" not in flat


def test_a_context_past_the_models_limit_is_refused_as_such():
    code, out = _plan_27b_3090("--context", "300k")
    assert code == 2 and "past this model's 262144 positions (max_position_embeddings)" in out
    assert "use --context 262144 or less, or stretch them with YaRN: --rope-scaling yarn:2" in out


def test_yarn_lifts_the_limit_and_the_serve_line_carries_it():
    """Qwen3-32B takes 40960 positions; its card's YaRN recipe (x4 over 32768) reaches 128K."""
    args = ("plan", "--model", "qwen3-32b", "--vram", "80G", "--sm", "90", "--context", "128k")
    code, out = _run(*args)
    assert code == 2 and "--rope-scaling yarn:4" in out
    code, out = _run(*args, "--rope-scaling", "yarn:4:32768")
    assert code == 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith("ninfer serve"))
    assert "--max-context 131072" in line and line.endswith("--rope-scaling yarn:4:32768")
    code, out = _run(*args, "--rope-scaling", "yarn:4:32768", "--context", "160k")
    assert code == 2 and "past this model's 131072 positions (YaRN x4 over 32768)" in out
    assert "stretch" not in out  # already stretched: no second hint
    code, out = _run(*args[:-2], "--rope-scaling", '{"rope_type": "yarn", "factor": 2}', "--json")
    assert code == 0 and json.loads(out)["plan"]["context"] == 81920  # 40960 x 2
    assert '--rope-scaling \'{"rope_type": "yarn", "factor": 2}\'' in json.loads(out)["plan"]["serve"]
    code, out = _run(*args, "--rope-scaling", "yarn:x")
    assert code == 2 and "the factor is a number" in out


def test_without_vram_and_gpu_asks_for_vram(monkeypatch):
    from engine.plan import gpu

    def no_nvml():
        raise ImportError("NVML Shared Library Not Found")

    monkeypatch.setattr(gpu, "_nvml", no_nvml)
    code, out = _run("plan", "--model", "qwen3-8b")
    assert code == 2
    assert "no GPU found here" in out and "--vram 24G" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "qwen3-8b", "--vram", "24G", "--vision"], "no vision tower"),
        (["--model", "qwen3-8b", "--vram", "24G", "--concurrency", "0"], "--concurrency must be 1 or more"),
        (["--model", "qwen3-8b", "--vram", "24G", "--spec", "mtp"], "no MTP head"),
        (["--model", "gpt-5", "--vram", "24G"], "unknown preset 'gpt-5'"),
        (["--model", "qwen3-8b", "--vram", "lots"], "--vram 'lots' is not a size"),
        (["--model", "qwen3-8b", "--vram", "24"], "--vram 24 is 24 bytes, under 1 GiB; write the unit"),
        (["--model", "qwen3-8b", "--vram", "0"], "--vram 0 is 0 bytes"),
        (
            ["--model", "qwen3-8b", "--vram", "24G", "--context", "0"],
            "--context must be 1 token or more (got 0)",
        ),
        (
            ["--model", "qwen3-8b", "--vram", "24G", "--spec", "ngram", "--draft-tokens", "100"],
            "--spec ngram takes --draft-tokens 1 to 16 (got 100)",
        ),
        (["--model", "qwen3-8b", "--vram", "24G", "--sm", "x"], "--sm 'x' is not a compute capability"),
        (["--model", "qwen3-8b", "--vram", "24G", "--kv-dtype", "int3"], "unknown KV dtype 'int3'"),
        (["--model", "qwen3-8b", "--vram", "24G", "--sm", "86", "--kv-dtype", "fp8"], "fp8 KV needs compute"),
        (["--model", "qwen3-8b", "--vram", "24G", "--recipe", "bf16", "--int8-prefill"], "these are 16-bit"),
        (
            ["--model", "qwen3.5-27b", "--vram", "24G", "--state-snapshots", "-2"],
            "--state-snapshots is a count of 0 or more (got -2)",
        ),
    ],
)
def test_bad_input_is_one_line(args, message):
    code, out = _run("plan", *args)
    assert code == 2
    assert message in out and "Traceback" not in out


def test_model_forms_hf_dir_config_json_and_ninfer(tmp_path):
    src = save_tiny(tiny_hf_model("qwen3", tied=False, head_dim=32), tmp_path / "src")
    artifact = tmp_path / "tiny.ninfer"
    convert(src, artifact, "w4g128")
    for model in (str(src), str(src / "config.json"), str(artifact)):
        code, out = _run("plan", model, "--vram", "1G", "--json")
        assert code == 0, out
        data = json.loads(out)
        assert data["plan"]["context"] == 1024  # the tiny model's positions
        assert data["plan"]["serve"].startswith("ninfer serve ")
    # the artifact counts its packed bytes: less than the bf16 directory
    weights = {}
    for model in (str(src), str(artifact)):
        ledger = json.loads(_run("plan", model, "--vram", "1G", "--json")[1])["plan"]["ledger"]
        weights[model] = sum(r["bytes"] for r in ledger if r["component"].startswith("weights"))
    assert weights[str(artifact)] < weights[str(src)]


def test_a_draft_model_takes_its_weights_and_kv_in_the_ledger():
    """qwen3-32b drafted by qwen3-0.6b: the draft's weights (as its preset's recipe) are a ledger row, each pool token carries both
    models' KV (64 + 28 layers), so the context is shorter than without it; the serve line names it."""
    base = ("plan", "--model", "qwen3-32b", "--vram", "24G", "--sm", "86", "--concurrency", "1", "--json")
    code, plain = _run(*base)
    assert code == 0, plain
    code, out = _run(*base, "--spec", "draft", "--draft-model", "qwen3-0.6b")
    assert code == 0, out
    alone, drafted = json.loads(plain)["plan"], json.loads(out)["plan"]
    rows = {r["component"]: r for r in drafted["ledger"]}
    from engine.plan.model import resolve

    draft = resolve(None, "qwen3-0.6b", None, None, mtp=False, vision=False)  # its preset's recipe
    assert rows["weights: draft model"]["bytes"] == sum(draft.weights.values()) > 0
    assert "(92 layers, k8v4)" in rows["KV pool"]["detail"]
    assert drafted["context"] < alone["context"]
    assert drafted["serve"].endswith("--spec draft --draft-tokens 3 --draft-model '<qwen3-0.6b artifact>'")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--spec", "draft"), "--spec draft needs --draft-model"),
        (("--draft-model", "qwen3-0.6b"), "a draft model drafts with --spec draft"),
        (("--spec", "draft", "--draft-model", "qwen3.5-9b"), "is a hybrid (recurrent-state layers)"),
    ],
)
def test_draft_model_flags_are_checked(args, message):
    code, out = _run("plan", "--model", "qwen3-32b", "--vram", "24G", *args)
    assert code == 2 and message in out and "Traceback" not in out


def test_a_draft_of_another_vocabulary_is_refused_by_plan_as_by_serve(tmp_path):
    """Model and draft given as files: plan makes serve's vocabulary check (presets have no tokenizer)."""
    target = save_tiny(tiny_hf_model("qwen3", tied=False), tmp_path / "target")
    wider = save_tiny(tiny_hf_model("qwen3", tied=True, vocab_size=600), tmp_path / "wider")
    same = save_tiny(tiny_hf_model("qwen3", tied=True, hidden_size=32), tmp_path / "same")
    base = ("plan", str(target), "--vram", "24G", "--sm", "86", "--spec", "draft", "--draft-model")
    code, out = _run(*base, str(wider))
    assert code == 2 and "has 600 token ids, the model 512" in out and "Traceback" not in out
    code, out = _run(*base, str(same))
    assert code == 0, out


def test_a_checkpoint_planned_at_a_recipe_is_served_so(tmp_path):
    """`plan DIR --recipe R` counts the weights at R; the serve line holds them so: w4g128 / w8g128 of a
    16-bit checkpoint quantized as it loads (--weight-quant int4 / int8), another recipe (or a checkpoint
    quantized already) converted first, the artifact served."""
    model = tiny_hf_model("qwen3", tied=False)
    src = save_tiny(model, tmp_path / "m")

    def plan(path, recipe):
        code, out = _run("plan", str(path), "--vram", "24G", "--recipe", recipe, "--json")
        assert code == 0, out
        return json.loads(out)["plan"]

    for recipe, flag in (("w4g128", "int4"), ("w8g128", "int8")):
        got = plan(src, recipe)
        assert got["serve"].startswith(f"ninfer serve {src} --weight-quant {flag} --device cuda")
        assert "prepare" not in got
    assert "--weight-quant" not in plan(src, "bf16")["serve"]
    got = plan(src, "q4.6")
    assert got["prepare"] == f"ninfer convert {src} {src}-q4.6.ninfer --recipe q4.6"
    assert got["serve"].startswith(f"ninfer serve {src}-q4.6.ninfer --device cuda")
    awq = save_tiny(model, tmp_path / "awq")  # (a recipe's bytes come from the config: the weights unread)
    config = json.loads((awq / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
    (awq / "config.json").write_text(json.dumps(config))
    got = plan(awq, "w4g128")
    assert got["prepare"] == f"ninfer convert {awq} {awq}-w4g128.ninfer --recipe w4g128"
    code, out = _run("plan", str(src), "--vram", "24G", "--recipe", "q4.6")
    assert code == 0 and "convert it first:" in out and "serve it:" in out
