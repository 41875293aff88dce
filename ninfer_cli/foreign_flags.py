"""`ninfer serve` with a command line copied from `vllm serve` or `llama-server`: their flags rewritten into
ninfer's before parsing, each said in one line on stderr. Flags with a meaning here map onto ninfer's
(`-c` -> `--ctx-size`, `-ngl 99` -> `--device cuda`, `-ctk q8_0 -ctv q4_0` -> `--kv-dtype k8v4`, `--temp`
-> a sampling default, `--speculative-config` -> `--spec`, ...); flags for what ninfer always does are
dropped (`--jinja`, `-fa`, `--enable-auto-tool-choice`, ...); those it cannot honour are refused."""

from __future__ import annotations

import json
import re

from engine.errors import NinferError
from engine.lora.spec import adapter_name
from engine.sampling_defaults import WHOLE_NUMBERS

# same meaning, ninfer's spelling (each takes a value unless it is a switch: see SWITCHES)
RENAMED = {
    "-m": "--model",
    "-c": "--ctx-size",
    "-np": "--parallel",
    "--n-parallel": "--parallel",
    "-a": "--alias",
    "-b": "--prefill-chunk",
    "--batch-size": "--prefill-chunk",
    "--max-num-batched-tokens": "--prefill-chunk",
    "-t": "--threads",
    "--draft-max": "--draft-tokens",
    "--draft": "--draft-tokens",
    "--draft-n": "--draft-tokens",
    "--enforce-eager": "--no-cuda-graphs",
    "--reranking": "--rerank",
    "--threads-batch": "--threads",
    "-tb": "--threads",
    "-mm": "--mmproj",
    "--ssl-key-file": "--ssl-keyfile",
    "--ssl-cert-file": "--ssl-certfile",
}
SWITCHES = {"--enforce-eager", "--reranking"}
# what ninfer always does (or has no knob for): dropped, said once
ALWAYS = {
    "--jinja": "chat templates are always rendered with Jinja",
    "--cont-batching": "batching is always continuous",
    "-cb": "batching is always continuous",
    "--metrics": "GET /metrics is always served",
    "--slots": "GET /slots is always served (behind --api-key)",
    "--mlock": "weights are read once into device memory",
    "--no-mmap": "weights are read once into device memory",
    "--trust-remote-code": "no checkpoint code is run",
    "--enable-auto-tool-choice": "tool calls are always parsed as the chat template writes them",
    "--enable-chunked-prefill": "prefill is always chunked",
    "--disable-log-requests": "requests are logged one line each",
    "--disable-log-stats": "stats are at GET /metrics",
    "--no-webui": "there is no web UI",
    "--async-scheduling": "the scheduler has one mode",
    "--disable-frontend-multiprocessing": "the server is one process",
    "--enable-sleep-mode": "POST /sleep, POST /wake_up and GET /is_sleeping are always served",
    "--enable-log-requests": "requests are logged one line each",
    "--enable-expert-parallel": "one GPU",
    "--calculate-kv-scales": "quantized KV keeps a scale per page row",
    "--no-warmup": "kernels compile at start-up either way",
    "--swa-full": "no sliding-window layers here",
    "--no-context-shift": "a prompt past the context is refused, never shifted",
    "--context-shift": "a prompt past the context is refused, never shifted",
    "--embedding": "an embedding model answers /v1/embeddings by itself",
    "--embeddings": "an embedding model answers /v1/embeddings by itself",
    "--verbose": "the server logs at info",
    "-v": "the server logs at info",
    "--log-disable": "the server logs at info",
    "--no-slots": "GET /slots is served behind --api-key, as the routes that run requests are",
    "--no-mmproj": "the vision tower loads only with --mmproj",
    "--no-mmproj-offload": "the vision tower runs on the model's device",
    "--allow-credentials": "no cookies are read; pages send the API key",
}
ALWAYS_WITH_VALUE = {
    "--tool-call-parser": "tool calls are parsed as the chat template writes them (Qwen's JSON or XML)",
    "--reasoning-parser": "<think> is parsed into reasoning wherever the template writes it",
    "-ub": "the prompt chunk is --prefill-chunk",
    "--ubatch-size": "the prompt chunk is --prefill-chunk",
    "--swap-space": "the host tier is --host-cache",
    "--max-seq-len-to-capture": "CUDA graphs cover every context",
    "--uvicorn-log-level": "the server logs at info",
    "--load-format": "the format is read from the file",
    "--download-dir": "ninfer fetch downloads",
    "--seed": "each request carries its own seed",
    "--max-loras": "LoRA adapters are held whole, as many as memory takes",
    "--max-lora-rank": "LoRA adapters of any rank are taken",
    "--max-cpu-loras": "LoRA adapters are held whole, as many as memory takes",
    "--lora-dtype": "LoRA adapters run in --dtype",
    "--quantization": "the weights' format is read from the file",
    "-q": "the weights' format is read from the file",
    "--limit-mm-per-prompt": "a request's images are limited by the context",
    "--mm-processor-kwargs": "images are resized by the checkpoint's preprocessor config",
    "--distributed-executor-backend": "one GPU",
    "--compilation-config": "decode steps replay CUDA graphs (--no-cuda-graphs turns them off)",
    "-O": "decode steps replay CUDA graphs (--no-cuda-graphs turns them off)",
    "--guided-decoding-backend": "structured outputs run on llguidance",
    "--structured-outputs-config": "structured outputs run on llguidance",
    "--response-role": "replies are the assistant's",
    "--max-log-len": "requests are logged one line each",
    "--tool-parser-plugin": "tool calls are parsed as the chat template writes them",
    "--chat-template-content-format": "message content is given to the template as it needs it",
    "--long-prefill-token-threshold": "prompts run in --prefill-chunk chunks beside decoding",
    "--scheduling-policy": "requests are admitted first come, first served",
    "--allowed-local-media-path": "images come inline (base64), never from paths",
    "--allowed-methods": "an allowed origin's pages may use every method the routes take",
    "--allowed-headers": "an allowed origin's pages may send any header",
    "-sm": "one GPU",
    "--split-mode": "one GPU",
    "--slot-save-path": "slots are not saved to files; --prefix-cache-file keeps the prefix cache across restarts",
    "-n": "a request's max_tokens (n_predict) sets it",
    "--n-predict": "a request's max_tokens (n_predict) sets it",
    "--ctx-checkpoints": "a hybrid model's state is snapshotted at page boundaries (--state-snapshots sets how many are kept)",
    "--keep": "a prompt past the context is refused, never shifted",
    "--log-file": "the server logs to stderr",
    "-to": "requests are not timed out while they run",
    "--timeout": "requests are not timed out while they run",
    "--threads-http": "the HTTP server is asynchronous",
    "--draft-min": "drafts are verified whatever their count",
    "--draft-p-min": "a draft model's greedy tokens are drafted",
    "-ngld": "the draft model runs where the model does",
    "--n-gpu-layers-draft": "the draft model runs where the model does",
    "-cd": "the draft model's KV takes the model's pages",
    "--ctx-size-draft": "the draft model's KV takes the model's pages",
    "--lora-base": "the adapters go on the served model",
}
OWN_DEVICE = re.compile(r"cpu|cuda(:\d+)?")  # ninfer's --device values (llama.cpp's are none, CUDA0, ...)
# refused in one line: what to do instead
REFUSED = {
    "--tokenizer": "ninfer reads the tokenizer beside the weights (tokenizer.json in the folder, or the GGUF's own)",
    "--revision": "give MODEL as OWNER/NAME@COMMIT (its download on this machine), or ninfer fetch REPO --revision COMMIT",
    "--hf-overrides": "ninfer reads config.json as it is; edit a copy of the checkpoint's config instead",
    "--kv-cache-memory": "size the KV pool in tokens with --kv-capacity N (ninfer plan shows the bytes a token takes)",
    "--mmproj-url": "download the mmproj first, pinned: ninfer fetch REPO --revision COMMIT --file NAME, then --mmproj PATH",
    "--override-kv": "ninfer reads the GGUF's metadata as it is",
    "--ssl-ca-certs": "client certificates are not asked for; put a TLS proxy in front to check them",
    "--ssl-cert-reqs": "client certificates are not asked for; put a TLS proxy in front to check them",
    "--ssl-keyfile-password": "an encrypted key is not taken; decrypt it (openssl pkey -in KEY -out PLAIN)",
}
FLASH_ATTN_VALUES = {"on", "off", "auto", "1", "0", "true", "false"}
# llama.cpp's -ctk / -ctv pairs -> ninfer's KV dtype
KV_PAIRS = {
    ("f16", "f16"): "fp16",
    ("bf16", "bf16"): "bf16",
    ("f32", "f32"): "fp32",
    ("q8_0", "q8_0"): "int8",
    ("q8_0", "q4_0"): "k8v4",
    ("q8_0", "q4_1"): "k8v4",
    ("q8_0", "iq4_nl"): "k8v4",
}
SAMPLING = {
    "--temp": "temperature",
    "--top-k": "top_k",
    "--top-p": "top_p",
    "--min-p": "min_p",
    "--repeat-penalty": "repetition_penalty",
    "--presence-penalty": "presence_penalty",
    "--frequency-penalty": "frequency_penalty",
    "--repeat-last-n": "repeat_last_n",
    "--dynatemp-range": "dynatemp_range",
    "--dynatemp-exp": "dynatemp_exponent",
    "--typical": "typical_p",
    "--top-nsigma": "top_n_sigma",
    "--xtc-probability": "xtc_probability",
    "--xtc-threshold": "xtc_threshold",
    "--dry-multiplier": "dry_multiplier",
    "--dry-base": "dry_base",
    "--dry-allowed-length": "dry_allowed_length",
    "--dry-penalty-last-n": "dry_penalty_last_n",
    "--mirostat": "mirostat",
    "--mirostat-ent": "mirostat_tau",
    "--mirostat-lr": "mirostat_eta",
}
MTP_METHODS = {"mtp", "qwen3_next_mtp", "qwen3_5_mtp", "deepseek_mtp"}
# flags only llama-server takes: a command line with one of them is llama-server's, whose --lora FILE applies
# the adapter to every request (vLLM's, and ninfer's own, only to requests that name it)
LLAMA_SERVER = {
    "-m",
    "-c",
    "-np",
    "-ngl",
    "--n-gpu-layers",
    "--gpu-layers",
    "-ctk",
    "-ctv",
    "--cache-type-k",
    "--cache-type-v",
    "-fa",
    "--flash-attn",
    "--jinja",
    "-cb",
    "--cont-batching",
    "-md",
    "--model-draft",
    "--lora-scaled",
    "--lora-init-without-apply",
    "-ub",
    "--temp",
    "--repeat-penalty",
    "--mlock",
    "--no-mmap",
}


ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


def _escapes(text: str) -> str:
    """llama.cpp's escapes in a flag's string (`--dry-sequence-breaker "\\n"`: a new line)."""
    return re.sub(r"\\(.)", lambda m: ESCAPES.get(m.group(1), m.group(0)), text)


def translate(args: list[str]) -> tuple[list[str], list[str]]:
    """(ninfer's arguments, one note per foreign flag) for `ninfer serve`'s arguments `args`."""
    args = _split_inline_values(args)
    out: list[str] = []
    notes: list[str] = []
    cache_types: dict[str, str] = {}
    sampling: dict[str, float | list[str]] = {}
    rope: dict[str, str] = {}
    gpu = None
    llama_server = any(arg.partition("=")[0] in LLAMA_SERVER for arg in args)
    applied: list[str] = []  # llama-server's adapters, each NAME=SCALE: applied to every request
    without_apply = False  # --lora-init-without-apply: they load at scale 0 instead
    thinking_off = False  # --reasoning-budget 0
    i = 0

    def value(flag: str) -> str:
        nonlocal i
        if i + 1 >= len(args):
            raise NinferError(f"{flag} needs a value")
        i += 1
        return args[i]

    while i < len(args):
        flag = args[i]
        if flag in SWITCHES:
            out.append(RENAMED[flag])
            notes.append(f"{flag} as {RENAMED[flag]}")
        elif flag in RENAMED:
            out += [RENAMED[flag], value(flag)]
            notes.append(f"{flag} as {RENAMED[flag] if flag != '-m' else 'the MODEL argument'}")
        elif flag in ALWAYS:
            notes.append(f"{flag} dropped: {ALWAYS[flag]}")
        elif flag in ALWAYS_WITH_VALUE:
            notes.append(f"{flag} {value(flag)} dropped: {ALWAYS_WITH_VALUE[flag]}")
        elif flag in ("-fa", "--flash-attn"):
            if i + 1 < len(args) and args[i + 1].lower() in FLASH_ATTN_VALUES:
                i += 1
            notes.append(f"{flag} dropped: attention is always flash-style (paged, online softmax)")
        elif flag in ("-ngl", "--n-gpu-layers", "--gpu-layers"):
            layers = value(flag)
            gpu = layers != "0"
            where = "cuda (every layer: ninfer keeps the whole model on the GPU)" if gpu else "cpu"
            notes.append(f"{flag} {layers} as --device {where}")
        elif flag in ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"):
            cache_types["k" if flag in ("-ctk", "--cache-type-k") else "v"] = value(flag).lower()
        elif flag in SAMPLING:
            number = _number(flag, value(flag))
            sampling[SAMPLING[flag]] = int(number) if SAMPLING[flag] in WHOLE_NUMBERS else number
        elif flag == "--dry-sequence-breaker":  # repeated, one breaker each; "none": no breakers
            breaker = value(flag)
            breakers = sampling.setdefault("dry_sequence_breakers", [])
            if breaker == "none":
                breakers.clear()
            else:
                breakers.append(breaker.encode().decode("unicode_escape"))  # "\n" as llama.cpp reads it
        elif flag in ("--samplers", "--sampling-seq"):
            notes.append(
                f"{flag} {value(flag)} dropped: ninfer's order is fixed (penalties and DRY, temperature, "
                "top-n-sigma, top-k, top-p, min-p, typical, XTC)"
            )
        elif flag in REFUSED:
            raise NinferError(f"{flag}: {REFUSED[flag]}")
        elif flag in ("-dev", "--device") and i + 1 < len(args) and not OWN_DEVICE.fullmatch(args[i + 1]):
            device = value(flag)  # llama.cpp's: none, or a backend device such as CUDA0
            gpu = device.lower() != "none"
            notes.append(f"{flag} {device} as --device {'cuda' if gpu else 'cpu'}")
        elif flag in ("--cache-ram", "-cram", "--kv-offloading-size"):
            # llama-server's host-RAM prompt cache (MiB; -1 no limit, 0 off), vLLM's KV offloading (GiB):
            # the prefix cache's host tier
            size = value(flag)
            amount, unit = _number(flag, size), "M" if flag != "--kv-offloading-size" else "G"
            if amount < 0:
                raise NinferError(
                    f"{flag} {size}: the host tier takes a size; give --host-cache SIZE (e.g. 16G)"
                )
            if amount > 0:
                out += ["--host-cache", f"{size}{unit}"]
                notes.append(f"{flag} {size} as --host-cache {size}{unit}")
            else:
                notes.append(f"{flag} 0 dropped: the host tier is off unless --host-cache is given")
        elif flag == "--cpu-offload-gb":
            size = value(flag)
            if _number(flag, size) > 0:
                raise NinferError(f"{flag} {size}: ninfer keeps the whole model on the GPU; drop {flag}")
            notes.append(f"{flag} {size} dropped: the whole model is on the GPU")
        elif flag == "--reasoning-budget":  # llama-server's: -1 unrestricted, 0 thinking off, N tokens
            given = value(flag)
            budget = _number(flag, given)
            if budget < -1 or budget != int(budget):
                raise NinferError(f"{flag} {given}: it takes -1 (think freely), 0 (thinking off) or N tokens")
            if budget == 0:
                thinking_off = True
            elif budget > 0:  # a request without a budget of its own reasons N tokens at most
                sampling["thinking_budget"] = int(budget)
            else:
                notes.append(
                    f"{flag} -1 dropped: the template's thinking is on unless a request turns it off"
                )
        elif flag == "--reasoning-format":
            kind = value(flag)
            if kind not in ("auto", "deepseek"):
                raise NinferError(
                    f"{flag} {kind}: ninfer always takes <think> out of the reply as reasoning_content (thinking "
                    f"blocks on Anthropic's API); drop {flag}"
                )
            notes.append(f"{flag} {kind} dropped: <think> is always parsed into reasoning_content")
        elif flag in ("--block-size", "--pooling"):
            given, kept = value(flag), "16" if flag == "--block-size" else "last"
            if given != kept:
                what = "KV pages of 16 tokens" if kept == "16" else "last-token pooling (Qwen3-Embedding's)"
                raise NinferError(f"{flag} {given}: ninfer runs {what}; drop {flag}")
            notes.append(f"{flag} {given} dropped: what ninfer runs")
        elif flag in ("-tp", "--tensor-parallel-size", "-pp", "--pipeline-parallel-size"):
            n = value(flag)
            if n != "1":
                raise NinferError(f"{flag} {n}: ninfer runs a model on one GPU; drop {flag}")
            notes.append(f"{flag} 1 dropped: one GPU")
        elif flag in ("-md", "--model-draft"):
            out += ["--spec", "draft", "--draft-model", value(flag)]
            notes.append(f"{flag} as --spec draft --draft-model")
        elif flag == "--speculative-config":
            spec = _speculative(value(flag))
            out += spec
            notes.append(f"--speculative-config as {' '.join(spec)}")
        elif flag in ("-hf", "--hf-repo", "-hfr"):
            raise NinferError(
                f"{flag}: serve reads a local file; download it first, pinned: ninfer fetch REPO --revision "
                "COMMIT --file NAME, then ninfer serve PATH"
            )
        elif flag == "--lora-scaled":
            first = value(flag)
            if i + 1 < len(args) and _is_number(args[i + 1]):  # the older FNAME SCALE
                pairs = [(first, value(flag))]
            else:  # FNAME:SCALE[,FNAME:SCALE...]
                pairs = [_scaled_lora(entry) for entry in first.split(",")]
            for path, scale in pairs:
                out += ["--lora", path]
                applied.append(f"{adapter_name(path)}={_number(flag, scale):g}")
        elif flag == "--api-key" and llama_server:  # llama-server takes several, comma-separated
            for key in value(flag).split(","):
                out += ["--api-key", key]
        elif flag == "--lora" and llama_server:
            for path in value(flag).split(","):  # llama-server takes several, comma-separated
                out += ["--lora", path]
                applied.append(adapter_name(path))
        elif flag == "--lora-init-without-apply":
            without_apply = True
        elif flag == "--rope-scaling" and i + 1 < len(args) and args[i + 1] in ("yarn", "linear"):
            rope["kind"] = value(flag)
        elif flag in ("--rope-scale", "--yarn-orig-ctx"):
            rope[flag] = value(flag)
        else:
            out.append(flag)
        i += 1
    if cache_types:
        out += ["--kv-dtype", _kv_dtype(cache_types)]
        notes.append(f"--cache-type-k / -v as --kv-dtype {out[-1]}")
    if sampling:
        out += ["--override-generation-config", json.dumps(sampling)]
        notes.append(f"sampling flags as --override-generation-config {out[-1]}")
    if rope:
        out += ["--rope-scaling", _rope_scaling(rope)]
        notes.append(f"llama.cpp's rope flags as --rope-scaling {out[-1]}")
    if without_apply:
        notes.append(
            "--lora-init-without-apply: the adapters load at scale 0; a request's lora list, or POST "
            "/lora-adapters, applies them"
        )
    elif applied:
        for entry in applied:
            out += ["--lora-default", entry]
        notes.append(
            "llama-server's --lora / --lora-scaled: every request that picks no adapter runs with "
            + ", ".join(applied)
            + " (--lora-default)"
        )
    if thinking_off:
        out = _thinking_off(out)
        notes.append("--reasoning-budget 0 as --chat-template-kwargs with enable_thinking false")
    if gpu is not None and "--device" not in out:
        out += ["--device", "cuda" if gpu else "cpu"]
    return _model_argument(out), notes


FOREIGN = {
    *RENAMED,
    "--reasoning-budget",
    "--reasoning-format",
    *REFUSED,
    "--cpu-offload-gb",
    "--cache-ram",
    "-cram",
    "--kv-offloading-size",
    "--block-size",
    "--pooling",
    "--model",
    *ALWAYS_WITH_VALUE,
    *SAMPLING,
    "--flash-attn",
    "--n-gpu-layers",
    "--gpu-layers",
    "--cache-type-k",
    "--cache-type-v",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--model-draft",
    "--speculative-config",
    "--hf-repo",
    "--rope-scale",
    "--yarn-orig-ctx",
    "--lora-scaled",
    "--api-key",  # llama-server's --api-key=K1,K2 split like its spaced form
}


def _thinking_off(args: list[str]) -> list[str]:
    """`args` with enable_thinking false in their --chat-template-kwargs (added when there is none; its
    other keys kept, and a JSON error in it left for the option to say)."""
    names = ("--chat-template-kwargs", "--default-chat-template-kwargs")
    given = [i for i, arg in enumerate(args) if arg in names and i + 1 < len(args)]
    kwargs: dict = {}
    if given:
        try:
            kwargs = json.loads(args[given[-1] + 1])
        except json.JSONDecodeError:
            return args
        if not isinstance(kwargs, dict):
            return args
    kwargs["enable_thinking"] = False
    rest = [arg for i, arg in enumerate(args) if not any(i in (at, at + 1) for at in given)]
    return [*rest, "--chat-template-kwargs", json.dumps(kwargs)]


def _split_inline_values(args: list[str]) -> list[str]:
    """A foreign --flag=value as --flag value (ninfer's own are left to the parser)."""
    out = []
    for arg in args:
        flag, eq, value = arg.partition("=")
        out += [flag, value] if eq and flag in FOREIGN else [arg]
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _scaled_lora(entry: str) -> tuple[str, str]:
    path, sep, scale = entry.rpartition(":")
    if not sep or not path or not _is_number(scale):
        raise NinferError(f"--lora-scaled takes FNAME:SCALE (comma-separated for more); got '{entry}'")
    return path, scale


def _number(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise NinferError(f"{flag} takes a number (got '{text}')") from None


def _rope_scaling(rope: dict[str, str]) -> str:
    """llama.cpp's --rope-scaling yarn|linear --rope-scale F [--yarn-orig-ctx N] as ninfer's --rope-scaling."""
    kind = rope.get("kind", "yarn")
    if "--rope-scale" not in rope:
        raise NinferError(
            f"--rope-scaling {kind} needs its factor: add --rope-scale F (e.g. 4 for 32K -> 128K)"
        )
    factor = _number("--rope-scale", rope["--rope-scale"])
    if kind == "linear":
        return json.dumps({"rope_type": "linear", "factor": factor})
    original = rope.get("--yarn-orig-ctx")
    return f"yarn:{factor:g}" + (f":{original}" if original and original != "0" else "")


def _kv_dtype(types: dict[str, str]) -> str:
    pair = (types.get("k", "f16"), types.get("v", "f16"))
    if pair not in KV_PAIRS:
        known = ", ".join(f"-ctk {k} -ctv {v}" for k, v in KV_PAIRS)
        raise NinferError(
            f"-ctk {pair[0]} -ctv {pair[1]} is not a KV cache ninfer keeps; it keeps {known} (or --kv-dtype)"
        )
    return KV_PAIRS[pair]


def _speculative(text: str) -> list[str]:
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise NinferError(f"--speculative-config is not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise NinferError("--speculative-config takes a JSON object")
    method = cfg.get("method")
    tokens = cfg.get("num_speculative_tokens")
    tail = ["--draft-tokens", str(tokens)] if isinstance(tokens, int) and not isinstance(tokens, bool) else []
    if method == "ngram":
        return ["--spec", "ngram", *tail]
    if method in MTP_METHODS:
        return ["--spec", "mtp", *tail]
    if cfg.get("model") and method in (None, "draft_model"):
        return ["--spec", "draft", "--draft-model", str(cfg["model"]), *tail]
    raise NinferError(
        f"--speculative-config method {method!r} is not one ninfer runs; it runs ngram, mtp and a draft model "
        '({"model": PATH})'
    )


def _model_argument(args: list[str]) -> list[str]:
    """llama-server's -m / --model PATH as serve's MODEL argument."""
    if "--model" not in args:
        return args
    i = args.index("--model")
    path = args[i + 1]
    rest = args[:i] + args[i + 2 :]
    return [path, *rest]
