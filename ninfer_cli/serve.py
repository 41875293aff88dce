"""`ninfer serve`: the OpenAI-compatible and Anthropic-native HTTP server."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from typing import Annotated

import typer

from engine.errors import NinferError
from engine.sizes import parse_size
from ninfer_cli.access import api_keys, exposure_warning, origins_warning, tls_options
from ninfer_cli.errors import exits_cleanly
from ninfer_cli.int8_option import Int8Prefill
from ninfer_cli.listen import bind
from ninfer_cli.loading import answering_while_loading
from ninfer_cli.model_options import (
    ChatTemplate,
    ChatTemplateKwargs,
    Device,
    Dtype,
    GenerationConfig,
    OverrideGenerationConfig,
    RopeScaling,
    StateSnapshots,
    WeightQuant,
)
from ninfer_cli.spec_options import DraftModel, DraftTokens, LmHeadDraft, Spec, spec_options
from ninfer_cli.vision_option import Mmproj, Vision

GRACE_S = 30  # seconds running requests get to finish after SIGTERM


@exits_cleanly
def serve(
    model: Annotated[
        str | None,
        typer.Argument(
            help="HF directory, .gguf or .ninfer (dummy:PRESET: random weights); none = the embedded default."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    model_id: Annotated[
        str | None,
        typer.Option(
            "--model-id",
            "--served-model-name",
            "--alias",
            help="The model name clients see (default: from the path); also --served-model-name, --alias.",
        ),
    ] = None,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            envvar="NINFER_API_KEY",
            metavar="KEY",
            help="Require this key (Bearer or x-api-key); repeat for more (any one is taken).",
        ),
    ] = None,
    api_key_file: Annotated[
        str | None,
        typer.Option(
            metavar="FILE", help="Keys to require, one a line (llama-server's); with --api-key, all taken."
        ),
    ] = None,
    allowed_origins: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-origins",
            metavar="ORIGIN",
            help="Web pages that may use the server (CORS): scheme://host[:port], a prefix ending in * "
            "(chrome-extension://*), or * for all; repeat or comma-separate. Default: this machine's pages "
            "and local apps (localhost, 127.0.0.1, app://, file://, vscode-webview://, ...).",
        ),
    ] = None,
    allowed_hosts: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-hosts",
            metavar="NAME",
            help="Host names requests may give besides this machine's (an IP, localhost, *.localhost, *.local, "
            "*.internal, its host name), checked while listening on the loopback only: a name a proxy "
            "forwards, *.example.com, or * for any; repeat or comma-separate.",
        ),
    ] = None,
    ssl_certfile: Annotated[
        str | None,
        typer.Option(metavar="CERT", help="Serve HTTPS with this PEM certificate (and --ssl-keyfile)."),
    ] = None,
    ssl_keyfile: Annotated[
        str | None, typer.Option(metavar="KEY", help="The certificate's private key (PEM, unencrypted).")
    ] = None,
    max_context: Annotated[
        str | None,
        typer.Option(
            "--max-context",
            "--max-model-len",
            "--ctx-size",
            help="Context limit in tokens, e.g. 180k; also --max-model-len, --ctx-size.",
        ),
    ] = None,
    kv_capacity: Annotated[
        str, typer.Option(help="KV pool in tokens, or auto: sized from the memory free after loading.")
    ] = "auto",
    max_concurrency: Annotated[
        int,
        typer.Option(
            "--max-concurrency",
            "--max-num-seqs",
            "--parallel",
            help="Requests running at once; also --max-num-seqs, --parallel.",
        ),
    ] = 4,
    max_pending_requests: Annotated[
        int, typer.Option(help="Requests queued beyond those; more get 429 / 529.")
    ] = 16,
    pending_timeout_ms: Annotated[
        int, typer.Option(help="A queued request expires after this long.")
    ] = 600_000,
    prefill_chunk: Annotated[
        int, typer.Option(help="Tokens per engine step (prompt chunks + decode).")
    ] = 2048,
    kv_dtype: Annotated[
        str,
        typer.Option(
            "--kv-dtype",
            "--kv-cache-dtype",
            help="auto, bf16, fp16, fp8 (fp8_e4m3), int8, k8v4 (rk8v4); also --kv-cache-dtype.",
        ),
    ] = "auto",
    host_cache: Annotated[
        str,
        typer.Option(
            help="Host memory for KV pages evicted from the prefix cache, e.g. 32G (0: off): a later "
            "request with that prefix copies them back instead of computing them again."
        ),
    ] = "0",
    state_snapshots: StateSnapshots = None,
    host_state_snapshots: Annotated[
        int | None,
        typer.Option(
            help="A hybrid model's state snapshots kept in host memory when the GPU slots (--state-snapshots) "
            "evict them, copied back for a later prompt that resumes there (default: an eighth of --host-cache, "
            "or three times the GPU slots without it; 0: off).",
        ),
    ] = None,
    prefix_cache_file: Annotated[
        str | None,
        typer.Option(
            help="Keep the prefix cache across restarts: written to this file at shutdown, read back into the "
            "host tier (--host-cache) at start-up when the same model and KV layout wrote it."
        ),
    ] = None,
    sleep_idle_seconds: Annotated[
        float,
        typer.Option(
            help="Sleep after this many seconds without a request: the GPU memory given back (weights and KV "
            "pool held in host memory, the prefix cache kept) until the next request wakes it; -1: never. "
            "POST /sleep and /wake_up do it by hand."
        ),
    ] = -1,
    device: Device = "cpu",
    dtype: Dtype = "auto",
    weight_quant: WeightQuant = "auto",
    cuda_graphs: Annotated[
        bool,
        typer.Option(
            help="CUDA: replay decode steps from captured graphs (falls back to eager if capture fails)."
        ),
    ] = True,
    spec: Spec = "none",
    draft_tokens: DraftTokens = 3,
    lm_head_draft: LmHeadDraft = False,
    draft_model: DraftModel = None,
    prediction_tokens: Annotated[
        int | None,
        typer.Option(
            help="With --spec: a request's prediction (OpenAI's Predicted Outputs) drafts up to this many tokens "
            "a step where the reply follows it (default: 16, at least --draft-tokens); steps past --draft-tokens "
            "run without CUDA graphs."
        ),
    ] = None,
    int8_prefill: Int8Prefill = False,
    vision: Vision = False,
    mmproj: Mmproj = None,
    rope_scaling: RopeScaling = None,
    chat_template: ChatTemplate = None,
    chat_template_kwargs: ChatTemplateKwargs = None,
    generation_config: GenerationConfig = "auto",
    rerank: Annotated[
        bool,
        typer.Option(
            help="Serve POST /v1/rerank by the model's yes / no next token, for a Qwen3-Reranker not "
            "recognised by itself (its model card, a classifier conversion and a rank GGUF are)."
        ),
    ] = False,
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option(
            help="GPU: the most of the device's memory this server takes (weights, KV pool and all), e.g. 0.9 "
            "to leave room for another process; default: all that is free after loading."
        ),
    ] = None,
    enable_prefix_caching: Annotated[
        bool, typer.Option(help="Reuse the KV pages of prompts' shared prefixes (on by default).")
    ] = True,
    cache_reuse: Annotated[
        int,
        typer.Option(
            "--cache-reuse",
            metavar="N",
            help="Past a prompt's cached prefix, take runs of N+ tokens an earlier prompt held further along "
            "(an editor's window that slid), keys shifted (llama-server's; 256 for llama.vim); 0: off.",
        ),
    ] = 0,
    override_generation_config: OverrideGenerationConfig = None,
    threads: Annotated[
        int | None, typer.Option(help="CPU threads for the engine's matmuls (default: torch's choice).")
    ] = None,
    lora: Annotated[
        list[str] | None,
        typer.Option(
            "--lora",
            "--lora-modules",
            help="A LoRA adapter (peft's save_pretrained folder, or a llama.cpp adapter .gguf) as NAME=PATH, or "
            "PATH (named after its folder or file); repeat for more. A request whose model is NAME runs with it.",
        ),
    ] = None,
    lora_default: Annotated[
        list[str] | None,
        typer.Option(
            "--lora-default",
            help="NAME[=SCALE]: a request that picks no adapter runs this one, its delta times SCALE (1), summed "
            "with the other defaults (llama-server's --lora); repeat for more. POST /lora-adapters changes them.",
        ),
    ] = None,
    enable_lora: Annotated[
        bool,
        typer.Option(
            "--enable-lora",
            help="Also load and unload LoRA adapters while serving (vLLM's POST /v1/load_lora_adapter, "
            "/v1/unload_lora_adapter).",
        ),
    ] = False,
):
    """Serve a model over the OpenAI and Anthropic protocols (and llama.cpp's /completion and /infill)."""
    import uvicorn

    from engine.api.app import create_app
    from engine.api.cors import origin_patterns
    from engine.api.hosts import host_patterns
    from engine.api.state import ServerState
    from engine.async_llm import AsyncLLM
    from engine.config import EngineConfig, check_device_visible
    from engine.lora.spec import lora_defaults
    from engine.models.loader import check_source
    from engine.sampling_defaults import describe

    check_device_visible(device)  # before the port is bound
    keys, tls = api_keys(api_key, api_key_file), tls_options(ssl_certfile, ssl_keyfile)
    origins = origin_patterns(allowed_origins or ())
    hosts = host_patterns(host, allowed_hosts or ())
    scheme = "https" if tls else "http"
    if sleep_idle_seconds != -1 and not sleep_idle_seconds > 0:
        raise NinferError(
            f"--sleep-idle-seconds must be a positive number of seconds, or -1 to stay awake (got {sleep_idle_seconds:g})"
        )
    options = dict(
        device=device,
        dtype=dtype,
        kv_dtype=kv_dtype,
        weight_quant=weight_quant,
        max_concurrency=max_concurrency,
        max_pending=max_pending_requests,
        pending_timeout_ms=pending_timeout_ms,
        prefill_chunk=prefill_chunk,
        cuda_graphs=cuda_graphs,
        **spec_options(spec, draft_tokens, lm_head_draft, draft_model),
        prediction_tokens=prediction_tokens,
        int8_prefill=int8_prefill,
        vision=vision,
        mmproj=mmproj,
        rope_scaling=rope_scaling,
        chat_template=chat_template,
        chat_template_kwargs=chat_template_kwargs,
        generation_config=generation_config,
        max_context=parse_size(max_context, "--max-context") if max_context else None,
        kv_capacity="auto" if kv_capacity == "auto" else parse_size(kv_capacity, "--kv-capacity"),
        host_cache=parse_size(host_cache, "--host-cache"),
        state_snapshots=state_snapshots,
        host_state_snapshots=host_state_snapshots,
        prefix_cache_file=prefix_cache_file,
        sleep_idle_seconds=None if sleep_idle_seconds == -1 else sleep_idle_seconds,
        rerank=rerank,
        lora_modules=tuple(lora or ()),
        gpu_memory_utilization=gpu_memory_utilization,
        enable_prefix_caching=enable_prefix_caching,
        cache_reuse=cache_reuse,
        override_generation_config=override_generation_config,
        threads=threads,
    )
    config = EngineConfig(model=model or "", **options)  # every flag checked before the port is bound
    name = model_id or (str(model).rstrip("/").split("/")[-1] if model else "smollm2-135m-instruct")
    if name in dict(config.lora_modules):
        raise NinferError(
            f"LoRA adapter name '{name}' is the served model's name (--model-id); give the adapter another"
        )
    defaults = lora_defaults(lora_default or (), [n for n, _ in config.lora_modules])
    check_source(model)  # a path that names no checkpoint is said before "loading"
    sock = bind(host, port)  # a port in use is said before the weights load
    port = sock.getsockname()[1]  # --port 0: the one the system chose
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    log = logging.getLogger("ninfer")
    log.info("loading the model; %s://%s:%d answers 503 until it is ready", scheme, host, port)
    for warning in (exposure_warning(host, keys, tls), origins_warning(origins, keys)):
        if warning is not None:
            log.warning("%s", warning)
    started = time.monotonic()
    try:
        with answering_while_loading(sock, tls, origins, hosts):
            engine = AsyncLLM(model, **options)
    except BaseException:
        sock.close()
        raise
    state = ServerState(
        engine,
        name,
        keys,
        lora_updates=enable_lora,
        lora_defaults=defaults,
        allowed_origins=origins,
        allowed_hosts=hosts,
    )
    app = create_app(state)
    log.info("serving %s on %s://%s:%d (%s)", name, scheme, host, port, engine.llm.description)
    log.info("%s", startup_summary(engine, time.monotonic() - started))
    runner = engine.llm.runner
    for tier, what in (
        (runner.host_kv, "KV pages ({:.1f} GiB) for prefixes evicted from the GPU pool"),
        (runner.host_states, "state snapshots ({:.1f} GiB) for those evicted from the GPU slots"),
    ):
        if tier is not None:
            log.info("host cache: %d %s", tier.num_slots, what.format(tier.num_bytes / 2**30))
    if config.sleep_idle_seconds is not None:
        log.log(*sleep_summary(engine.llm, config.sleep_idle_seconds))
    if engine.llm.draft_model is not None:
        log.info(
            "speculative decoding: %s drafts %d tokens a step, its KV in the same pool",
            draft_model,
            engine.llm.engine_config.draft_tokens,
        )
    adapters = engine.llm.adapters
    if adapters.names:
        log.info(
            "LoRA adapters (%.1f MiB): %s; a request whose model is one of these names runs with it, or its "
            "lora list picks them by id (GET /lora-adapters)",
            adapters.num_bytes / 2**20,
            ", ".join(
                f"{adapter} (id {adapters.slots[adapter]}, rank {rank})"
                for adapter, rank in adapters.ranks.items()
            ),
        )
        if defaults:
            log.info(
                "a request that picks no adapter runs with %s",
                " + ".join(f"{scale:g} x {adapter}" for adapter, scale in defaults.items()),
            )
    if gpu_memory_utilization is not None and device == "cpu":
        log.info("--gpu-memory-utilization applies to a GPU; on the CPU the KV pool is --kv-capacity's")
    if enable_lora:
        log.info(
            "LoRA adapters load and unload while serving: POST /v1/load_lora_adapter, /v1/unload_lora_adapter"
        )
    refused = "; text routes are refused" if engine.llm.text_refusal else ""
    if engine.llm.rerank_head is not None:
        log.info("a reranker: it answers POST /v1/rerank (also /rerank, /v2/rerank, /v1/score)%s", refused)
    elif refused:
        log.info("an embedding model (no output head): it answers POST /v1/embeddings%s", refused)
    if engine.llm.sampling_defaults:
        log.info(
            "sampling defaults for the fields a request leaves out: %s (--generation-config %s; none for "
            "ninfer's own)",
            describe(engine.llm.sampling_defaults),
            generation_config,
        )
    if config.chat_template_kwargs:
        log.info(
            "chat template variables for the requests that leave them out: %s (--chat-template-kwargs)",
            ", ".join(f"{name}={json.dumps(value)}" for name, value in config.chat_template_kwargs),
        )
    _Server = _server_class()
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=GRACE_S + 2, **tls
    )
    try:
        _Server(config, state).run(sockets=[sock])
    finally:
        sock.close()
        engine.shutdown()


def sleep_summary(llm, seconds: float) -> tuple[int, str]:
    """(log level, line) for --sleep-idle-seconds at start-up: what sleeping will hold in host memory, and
    a warning, with what to change, when host memory free now cannot hold it."""
    from engine.sizes import format_bytes
    from engine.worker.sleep import host_memory_free

    free = host_memory_free()
    full, weights = llm.sleep_host_bytes()
    head = f"sleeps after {seconds:g} s without a request"
    if full <= free:
        return (
            logging.INFO,
            f"{head}, holding {format_bytes(full)} in host memory ({format_bytes(free)} free)",
        )
    short = f"host memory ({format_bytes(free)} free, 2 GiB kept for the system)"
    if weights <= free:
        return logging.WARNING, (
            f"{head}, but {short} cannot hold the KV pool beside the weights ({format_bytes(full)}): it will "
            f"sleep at level 2, holding the weights ({format_bytes(weights)}) and dropping the prefix cache; "
            "free host memory, or give a smaller --kv-capacity"
        )
    return logging.WARNING, (
        f"{head}, but {short} cannot hold the weights ({format_bytes(weights)}): it will stay awake; free "
        "host memory, or drop --sleep-idle-seconds"
    )


def startup_summary(engine, load_s: float) -> str:
    """One line of what the engine is, as allocated: what a slow decode is checked for first (the KV dtype
    really applied, the pool beside the context, CUDA graphs, the device), and the load time."""
    info, llm = engine.info(), engine.llm
    pool_gib = llm.runner.kv_cache_bytes / 2**30
    spec = f", spec {info['spec']} ({info['draft_tokens']} drafts)" if info["spec"] != "none" else ""
    return (
        f"ready in {load_s:.1f} s: {info['device']} {info['dtype']}, context {int(info['max_context']):,} "
        f"tokens, KV pool {int(info['kv_pool_tokens']):,} tokens ({info['kv_dtype']}, {pool_gib:.2f} GiB), "
        f"{llm.engine_config.max_concurrency} running at most, CUDA graphs {info['cuda_graphs']}{spec}"
    )


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """SIGTERM / Ctrl-C: stop accepting, let running requests finish for GRACE_S, then end the rest
        with a final error event; exit 0. A second signal exits at once."""

        def __init__(self, config, state):
            super().__init__(config)
            self.ninfer_state = state

        @contextlib.contextmanager
        def capture_signals(self):
            def stop(signum, frame):
                if self.should_exit:
                    self.force_exit = True
                self.should_exit = True
                logging.getLogger("ninfer").info(
                    "shutting down: running requests get %d s to finish", GRACE_S
                )
                timer = threading.Timer(GRACE_S, lambda: setattr(self.ninfer_state, "ending", True))
                timer.daemon = True
                timer.start()

            previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    return Server
