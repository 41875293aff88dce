"""`ninfer serve` with a command line copied from vllm serve or llama-server (ninfer_cli/foreign_flags.py)."""

from __future__ import annotations

import json
import shlex
import signal

import httpx2 as httpx
import pytest
from conftest import run_serve
from serve_process import start_serve

from engine.errors import NinferError
from ninfer_cli.foreign_flags import translate


def test_a_vllm_command_line():
    args, notes = translate(
        [
            "/models/Qwen3-8B",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--reasoning-parser=qwen3",
            "--max-model-len",
            "32768",
            "--gpu-memory-utilization",
            "0.9",
            "--enable-prefix-caching",
            "--trust-remote-code",
            "--dtype",
            "auto",
            "--tensor-parallel-size",
            "1",
            "--enforce-eager",
            "--max-num-batched-tokens",
            "4096",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}',
        ]
    )
    assert args == [
        "/models/Qwen3-8B",
        "--max-model-len",
        "32768",
        "--gpu-memory-utilization",
        "0.9",
        "--enable-prefix-caching",
        "--dtype",
        "auto",
        "--no-cuda-graphs",
        "--prefill-chunk",
        "4096",
        "--spec",
        "ngram",
        "--draft-tokens",
        "4",
    ]
    assert (
        "--reasoning-parser qwen3 dropped: <think> is parsed into reasoning wherever the template writes it"
        in notes
    )
    assert "--enforce-eager as --no-cuda-graphs" in notes and len(notes) == 8


def test_a_llama_server_command_line():
    args, notes = translate(
        shlex.split(
            "-m /models/qwen3-8b.gguf -c 32768 -ngl 99 --jinja -fa on -np 2 --host 0.0.0.0 --port 8080 "
            "-ctk q8_0 -ctv q4_0 --temp 0.6 --top-k 20 --top-p 0.95 --min-p 0 -t 8 -md /models/qwen3-0.6b.gguf "
            "--draft-max 4 --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32768"
        )
    )
    assert args[0] == "/models/qwen3-8b.gguf"
    flags = dict(zip(args[1::2], args[2::2]))
    assert flags == {
        "--ctx-size": "32768",
        "--parallel": "2",
        "--host": "0.0.0.0",
        "--port": "8080",
        "--threads": "8",
        "--spec": "draft",
        "--draft-model": "/models/qwen3-0.6b.gguf",
        "--draft-tokens": "4",
        "--kv-dtype": "k8v4",
        "--override-generation-config": json.dumps(
            {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.0}
        ),
        "--rope-scaling": "yarn:4:32768",
        "--device": "cuda",
    }
    assert "-ngl 99 as --device cuda (every layer: ninfer keeps the whole model on the GPU)" in notes
    # the old flag form of -fa, and -ngl 0: the CPU
    args, _ = translate(["-fa", "-ngl", "0", "--port", "1"])
    assert args == ["--port", "1", "--device", "cpu"]
    # ninfer's own flags pass as they are, --flag=value too
    assert translate(["--kv-dtype=int8", "--spec", "mtp"]) == (["--kv-dtype=int8", "--spec", "mtp"], [])


def test_llama_server_sampler_flags_become_sampling_defaults():
    line = (
        "-m m.gguf --dry-multiplier 0.8 --dry-base 1.75 --dry-allowed-length 2 --dry-penalty-last-n -1 "
        "--dry-sequence-breaker '\\n' --dry-sequence-breaker '###' --xtc-probability 0.5 --xtc-threshold 0.1 "
        "--typical 0.9 --top-nsigma 1.5 --repeat-last-n 64 --presence-penalty 1.5 --dynatemp-range 0.2 "
        "--dynatemp-exp 1 --mirostat 2 --mirostat-ent 4 --mirostat-lr 0.2 --samplers penalties;dry;top_k"
    )
    args, notes = translate(shlex.split(line))
    flags = dict(zip(args[1::2], args[2::2]))
    assert json.loads(flags["--override-generation-config"]) == {
        "dry_multiplier": 0.8,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": -1,
        "dry_sequence_breakers": ["\n", "###"],
        "xtc_probability": 0.5,
        "xtc_threshold": 0.1,
        "typical_p": 0.9,
        "top_n_sigma": 1.5,
        "repeat_last_n": 64,
        "presence_penalty": 1.5,
        "dynatemp_range": 0.2,
        "dynatemp_exponent": 1.0,
        "mirostat": 2,
        "mirostat_tau": 4.0,
        "mirostat_eta": 0.2,
    }
    assert any(n.startswith("--samplers penalties;dry;top_k dropped: ninfer's order is fixed") for n in notes)
    # they parse as serve's defaults, and a value out of range is refused there in one line
    from engine.sampling_defaults import parse_overrides

    defaults = dict(parse_overrides(flags["--override-generation-config"]))
    assert defaults["dry_sequence_breakers"] == ("\n", "###") and defaults["dry_allowed_length"] == 2
    with pytest.raises(NinferError, match="--override-generation-config: typical_p must be in"):
        parse_overrides('{"typical_p": 2}')
    args, _ = translate(["--dry-sequence-breaker", "none"])
    assert json.loads(args[1]) == {"dry_sequence_breakers": []}


def test_llama_server_lora_flags_apply_the_adapters_to_every_request():
    """llama-server's --lora applies the adapter to every request (ninfer's and vLLM's only to requests that
    name it): in a llama-server command line it also becomes --lora-default; --lora-scaled in either form."""
    args, notes = translate(
        shlex.split(
            "-m /m/base.gguf --lora /a/tone.gguf,/a/json.gguf --lora-scaled /a/sql.gguf:0.5 "
            "--lora-scaled /a/old.gguf 0.25"
        )
    )
    assert args == [
        "/m/base.gguf",
        *(
            "--lora",
            "/a/tone.gguf",
            "--lora",
            "/a/json.gguf",
            "--lora",
            "/a/sql.gguf",
            "--lora",
            "/a/old.gguf",
        ),
        *("--lora-default", "tone", "--lora-default", "json", "--lora-default", "sql=0.5"),
        *("--lora-default", "old=0.25"),
    ]
    assert notes[-1] == (
        "llama-server's --lora / --lora-scaled: every request that picks no adapter runs with tone, json, "
        "sql=0.5, old=0.25 (--lora-default)"
    )
    # loaded, not applied
    args, notes = translate(shlex.split("-m /m/base.gguf --lora /a/tone.gguf --lora-init-without-apply"))
    assert args == ["/m/base.gguf", "--lora", "/a/tone.gguf"]
    assert "the adapters load at scale 0" in notes[-1]
    # ninfer's (and vLLM's) --lora is left as it is: requests name the adapter
    assert translate(["/m", "--lora", "tone=/a/tone"]) == (["/m", "--lora", "tone=/a/tone"], [])


def test_more_of_what_vllm_and_llama_server_take():
    """Flags for what ninfer does its own way are dropped with a note; values that say what ninfer always
    does pass; llama.cpp's device names map onto ninfer's --device."""
    args, notes = translate(
        shlex.split(
            "/m --max-loras 4 --max-lora-rank 64 --quantization awq --block-size 16 --cpu-offload-gb 0 "
            "--async-scheduling -sm none --cache-reuse 256 -n 512 --pooling last --reranking -tb 4"
        )
    )
    assert args == ["/m", "--cache-reuse", "256", "--rerank", "--threads", "4"]  # --cache-reuse: ninfer's own
    assert "--max-lora-rank 64 dropped: LoRA adapters of any rank are taken" in notes
    assert translate(["-dev", "CUDA0"]) == (["--device", "cuda"], ["-dev CUDA0 as --device cuda"])
    # vLLM's CORS flags: the origins are ninfer's flag (its JSON list read as is), the rest is always so
    args, notes = translate(
        shlex.split("""/m --allowed-origins '["*"]' --allowed-methods '["*"]' --allow-credentials""")
    )
    assert args == ["/m", "--allowed-origins", '["*"]']
    assert "--allow-credentials dropped: no cookies are read; pages send the API key" in notes
    assert translate(["--device", "none"])[0] == ["--device", "cpu"]
    assert translate(["--device", "cuda:1"]) == (["--device", "cuda:1"], [])  # ninfer's own
    # llama-server's host-RAM prompt cache (MiB) and vLLM's KV offloading (GiB): the host tier
    assert translate(["--cache-ram", "8192"]) == (
        ["--host-cache", "8192M"],
        ["--cache-ram 8192 as --host-cache 8192M"],
    )
    assert translate(["-cram", "0"])[0] == [] and translate(["--kv-offloading-size", "16"])[0] == [
        "--host-cache",
        "16G",
    ]


def test_reasoning_flags_turn_thinking_off_by_the_template_kwargs():
    """llama-server's --reasoning-budget 0 is enable_thinking false in --chat-template-kwargs (merged with
    one given, in either spelling), N a served thinking_budget, -1 the default; --reasoning-format deepseek
    / auto is what ninfer does. vLLM's --default-chat-template-kwargs is ninfer's own option."""
    args, notes = translate(shlex.split("-m /q.gguf --reasoning-budget 0 --reasoning-format deepseek"))
    assert args == ["/q.gguf", "--chat-template-kwargs", '{"enable_thinking": false}']
    assert "--reasoning-budget 0 as --chat-template-kwargs with enable_thinking false" in notes
    assert "--reasoning-format deepseek dropped: <think> is always parsed into reasoning_content" in notes
    given = ["/m", "--default-chat-template-kwargs", '{"greeting": "hi"}', "--reasoning-budget=0"]
    assert translate(given)[0] == [
        "/m",
        "--chat-template-kwargs",
        '{"greeting": "hi", "enable_thinking": false}',
    ]
    assert translate(["/m", "--reasoning-budget", "-1"])[0] == ["/m"]
    assert translate(["/m", "--reasoning-budget", "2048"])[0] == [
        "/m",
        "--override-generation-config",
        '{"thinking_budget": 2048}',
    ]
    bad = ["/m", "--chat-template-kwargs", "{x", "--reasoning-budget", "0"]
    assert translate(bad)[0] == bad[:3]  # left for the option to say what is wrong with it
    bad[1] = "--default-chat-template-kwargs"
    assert translate(bad)[0] == bad[:3]
    assert translate(["/m", "--default-chat-template-kwargs", "{}"])[0] == [
        "/m",
        "--default-chat-template-kwargs",
        "{}",
    ]


def test_llama_servers_tls_and_key_list():
    """llama-server's --ssl-key-file / --ssl-cert-file are ninfer's --ssl-keyfile / --ssl-certfile; its
    comma-separated --api-key is one --api-key each; vLLM's spellings are ninfer's own."""
    args, notes = translate(
        ["-m", "/q.gguf", "--ssl-key-file", "k.pem", "--ssl-cert-file", "c.pem", "--api-key=a,b"]
    )
    assert args == [
        "/q.gguf",
        "--ssl-keyfile",
        "k.pem",
        "--ssl-certfile",
        "c.pem",
        "--api-key",
        "a",
        "--api-key",
        "b",
    ]
    assert "--ssl-key-file as --ssl-keyfile" in notes
    assert translate(["/m", "--api-key", "a,b", "--ssl-keyfile", "k"])[0] == [
        "/m",
        "--api-key",
        "a,b",
        "--ssl-keyfile",
        "k",
    ]
    with pytest.raises(NinferError, match="client certificates are not asked for"):
        translate(["/m", "--ssl-ca-certs", "ca.pem"])


def test_llama_servers_mmproj_is_ninfers():
    """-mm / --mmproj: the vision tower's file, the same flag here; --no-mmproj(-offload) said and dropped."""
    args, notes = translate(["-m", "/q.gguf", "-mm", "/mmproj.gguf", "--no-mmproj-offload"])
    assert args == ["/q.gguf", "--mmproj", "/mmproj.gguf"]
    assert "-mm as --mmproj" in notes
    assert "--no-mmproj-offload dropped: the vision tower runs on the model's device" in notes
    assert translate(["/q.gguf", "--mmproj=/v.gguf"])[0] == ["/q.gguf", "--mmproj=/v.gguf"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lora-scaled", "/a/x.gguf:half"], "--lora-scaled takes FNAME:SCALE"),
        (["--tokenizer", "/t"], "--tokenizer: ninfer reads the tokenizer beside the weights"),
        (["--revision", "main"], "--revision: give MODEL as OWNER/NAME@COMMIT"),
        (["--mmproj-url", "https://x/v.gguf"], "--mmproj-url: download the mmproj first, pinned"),
        (["--cpu-offload-gb", "8"], "--cpu-offload-gb 8: ninfer keeps the whole model on the GPU"),
        (["--cache-ram", "-1"], "--cache-ram -1: the host tier takes a size; give --host-cache SIZE"),
        (["--block-size", "32"], "--block-size 32: ninfer runs KV pages of 16 tokens"),
        (["--pooling", "mean"], "--pooling mean: ninfer runs last-token pooling"),
        (["--kv-cache-memory", "8G"], "size the KV pool in tokens with --kv-capacity N"),
        (["-tp", "2"], "-tp 2: ninfer runs a model on one GPU; drop -tp"),
        (["-ctk", "q8_0"], "-ctk q8_0 -ctv f16 is not a KV cache ninfer keeps"),
        (
            ["--speculative-config", '{"method": "eagle3", "model": "x"}'],
            "method 'eagle3' is not one ninfer runs",
        ),
        (["-hf", "Qwen/Qwen3-8B-GGUF"], "-hf: serve reads a local file; download it first"),
        (["--temp", "warm"], "--temp takes a number (got 'warm')"),
        (["--rope-scaling", "yarn"], "--rope-scaling yarn needs its factor: add --rope-scale F"),
        (["-c"], "-c needs a value"),
        (
            ["--reasoning-budget", "-5"],
            "--reasoning-budget -5: it takes -1 (think freely), 0 (thinking off) or N",
        ),
        (["--reasoning-budget", "1.5"], "--reasoning-budget 1.5: it takes -1"),
        (["--reasoning-budget", "lots"], "--reasoning-budget takes a number (got 'lots')"),
        (["--reasoning-format", "none"], "--reasoning-format none: ninfer always takes <think> out"),
    ],
)
def test_what_cannot_be_taken_is_refused(args, message):
    with pytest.raises(NinferError, match=message.replace("(", r"\(").replace(")", r"\)")):
        translate(args)


def test_the_console_script_translates_and_refuses_in_one_line():
    proc = run_serve("-tp", "4")
    assert proc.returncode == 2 and proc.stderr == "error: -tp 4: ninfer runs a model on one GPU; drop -tp\n"
    # translated, then refused by serve's own check, before any model loads
    proc = run_serve("-c", "4096", "--jinja", "--gpu-memory-utilization", "1.5")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "ninfer serve: -c as --ctx-size",
        "ninfer serve: --jinja dropped: chat templates are always rendered with Jinja",
        "error: gpu_memory_utilization is a fraction of the GPU's memory, above 0 and at most 1 (got 1.5)",
    ]


@pytest.mark.slow
def test_a_llama_server_line_serves_the_embedded_model():
    """The translated flags are serve's own: the server starts, runs on them and answers."""
    line = "-c 4096 -ngl 0 --jinja -fa on -np 2 -ctk q8_0 -ctv q8_0 --temp 0 -t 2 --metrics --cont-batching"
    proc, port = start_serve(*shlex.split(line))
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 12,
            },
            timeout=60,
        )
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]
        props = httpx.get(f"http://127.0.0.1:{port}/props", timeout=10).json()
        assert props["default_generation_settings"]["params"]["temperature"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "context 4,096 tokens" in err and "(int8," in err and "2 running at most" in err
    assert "ninfer serve: -ctk / -ctv" not in err and "--cache-type-k / -v as --kv-dtype int8" in err
