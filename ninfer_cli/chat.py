"""`ninfer chat`: a line-based REPL with streaming output, or a one-shot answer with --prompt."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from engine.errors import NinferError
from engine.sizes import parse_size
from ninfer_cli.chat_backends import LocalChat, PromptProgress, RemoteChat, ReplyStats, check_source
from ninfer_cli.chat_input import piped_line_reader, read_message, terminal_line_reader
from ninfer_cli.chat_session import COMMANDS as SESSION_COMMANDS
from ninfer_cli.chat_session import Conversation
from ninfer_cli.errors import exits_cleanly
from ninfer_cli.int8_option import Int8Prefill
from ninfer_cli.model_options import (
    ChatTemplate,
    ChatTemplateKwargs,
    Device,
    Dtype,
    GenerationConfig,
    OverrideGenerationConfig,
    RopeScaling,
    WeightQuant,
)
from ninfer_cli.spec_options import DraftModel, DraftTokens, LmHeadDraft, Spec, spec_options
from ninfer_cli.vision_option import Mmproj, Vision

CHAT_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}  # greedy, unless the model or a flag says
HELP_LINE = (
    "Type a message and press Enter (end a line with \\ to go on, or put several lines between lines of "
    '"""). Commands: /reset (or /clear) clears the conversation, /compact has the model summarise it (the '
    "summary replaces the turns), /undo takes back the last exchange, /retry "
    "asks for the last reply again, /system TEXT sets the system message, /save FILE and /load FILE keep a "
    "conversation (JSON), /exit quits (or Ctrl-D), /help shows this. Start a line with a space to send it as "
    "it is."
)
COMMAND = re.compile(r"/[A-Za-z?]+")  # a line of one such word is a command, never a message
IMAGE_HELP = "/image PATH attaches a picture to your next message."


def _stream_reply(backend, messages, params, out, verbose: bool = False, note_context: bool = True) -> str:
    """The reply, streamed to `out`; after it, with `verbose` its stats, and with `note_context` a note when
    the conversation nears the context (where the backend knows it)."""
    reply = []
    limit = getattr(backend, "context_limit", None) if note_context else None
    stats = ReplyStats(time.perf_counter()) if verbose or limit else None
    progress = PromptProgress(sys.stderr)
    try:
        for delta in backend.reply(messages, params, stats, progress):
            out.write(delta)
            out.flush()
            reply.append(delta)
    except KeyboardInterrupt:
        progress.clear()
        out.write(" [interrupted]")
    out.write("\n")
    out.flush()
    if verbose:
        Console(stderr=True).print(f"[dim]{stats.line()}[/dim]", highlight=False)
    note = stats.context_note(limit) if stats is not None else None
    if note is not None:
        Console(stderr=True).print(f"[dim]{note}[/dim]", highlight=False)
    return "".join(reply)


@exits_cleanly
def chat(
    model: Annotated[
        str | None,
        typer.Argument(
            help="HF directory, .gguf or .ninfer (dummy:PRESET: random weights); default: the embedded SmolLM2-135M"
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(help="Chat with a running OpenAI-compatible server instead (ninfer serve, vLLM, ...)."),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="NINFER_API_KEY", help="With --url: the server's key.")
    ] = None,
    model_id: Annotated[
        str | None, typer.Option(help="With --url: the model to ask for (default: the server's first).")
    ] = None,
    prompt: Annotated[
        str | None,
        typer.Option(
            "--prompt", "-p", help="Answer this one message and exit ('-': read it from standard input)."
        ),
    ] = None,
    system: Annotated[str | None, typer.Option(help="System message.")] = None,
    max_tokens: Annotated[int, typer.Option(help="Most tokens per reply.")] = 512,
    temperature: Annotated[
        float | None,
        typer.Option(
            help="0 = greedy (default: the model's recommended, see --generation-config; else 0; with --url, "
            "the server's default)."
        ),
    ] = None,
    top_p: Annotated[float | None, typer.Option(help="Default: the model's recommended, else 1.")] = None,
    top_k: Annotated[
        int | None, typer.Option(help="0 = off (default: the model's recommended, else 0).")
    ] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    device: Device = "cpu",
    dtype: Dtype = "auto",
    max_context: Annotated[str | None, typer.Option(help="Context limit in tokens, e.g. 32k.")] = None,
    kv_dtype: Annotated[
        str, typer.Option(help="KV cache dtype: auto, bf16, fp16, fp8, int8, k8v4.")
    ] = "auto",
    weight_quant: WeightQuant = "auto",
    spec: Spec = "none",
    draft_tokens: DraftTokens = 3,
    lm_head_draft: LmHeadDraft = False,
    draft_model: DraftModel = None,
    int8_prefill: Int8Prefill = False,
    vision: Vision = False,
    mmproj: Mmproj = None,
    rope_scaling: RopeScaling = None,
    chat_template: ChatTemplate = None,
    chat_template_kwargs: ChatTemplateKwargs = None,
    generation_config: GenerationConfig = "auto",
    override_generation_config: OverrideGenerationConfig = None,
    lora: Annotated[
        str | None,
        typer.Option(help="A LoRA adapter (peft's save_pretrained folder) the replies run with."),
    ] = None,
    image: Annotated[
        list[Path] | None,
        typer.Option(
            "--image",
            help="With --prompt (and --vision, or --url): a picture the message carries (repeatable).",
        ),
    ] = None,
    json_schema: Annotated[
        str | None,
        typer.Option(help="Replies are JSON following this schema (inline JSON, or a file holding it)."),
    ] = None,
    grammar_file: Annotated[
        Path | None,
        typer.Option(help="Replies follow this grammar: llama.cpp's GBNF (root ::= ...) or llguidance Lark."),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="After each reply: prompt tokens (cached), first-token time, decode tok/s.",
        ),
    ] = False,
):
    """Chat with a model in the terminal (streaming)."""
    from engine import LLM, SamplingParams
    from engine.chat_template import parse_template_kwargs
    from engine.lora.spec import lora_modules
    from engine.sampling_defaults import parse_overrides

    check_source(model, url)
    if prompt == "-":  # the whole of stdin is the message: cat review.txt code.py | ninfer chat -p -
        prompt = sys.stdin.read().rstrip().lstrip("\r\n")  # a file's last newline is not part of the message
        if not prompt:
            raise NinferError(
                "--prompt - reads the message from standard input, which was empty; pipe it in "
                "(cat question.txt | ninfer chat -p -)"
            )
    if lora is not None and url is not None:
        raise NinferError(
            "--lora loads an adapter into the engine here; with --url, ask for the server's adapter by its name "
            "(--model-id NAME)"
        )
    adapters = lora_modules(lora) if lora is not None else ()  # a folder that is not there: said at once
    grammar, request_fields = structured_output(json_schema, grammar_file)
    template_kwargs = dict(parse_template_kwargs(chat_template_kwargs))  # a bad one is said before loading
    if template_kwargs:  # with --url the requests carry them (the local engine takes them below)
        request_fields["chat_template_kwargs"] = template_kwargs
    flags = (("temperature", temperature), ("top_p", top_p), ("top_k", top_k))
    # the sampling flags given, over --override-generation-config's fields (checked here, before loading)
    given = {**dict(parse_overrides(override_generation_config)), **{k: v for k, v in flags if v is not None}}
    sampling = {**CHAT_SAMPLING, **given}
    # bad flags are said before the model loads
    SamplingParams(max_tokens=max_tokens, seed=seed, grammar=grammar, **sampling)
    console = Console(stderr=True)
    if url is not None:  # the engine options do not apply: the server has its own, its sampling defaults too
        backend = RemoteChat(url, api_key, model_id, request_fields, sampling=given)
    else:
        with console.status("loading model…"):
            llm = LLM(
                model,
                device=device,
                dtype=dtype,
                kv_dtype=kv_dtype,
                weight_quant=weight_quant,
                max_context=parse_size(max_context, "--max-context") if max_context else None,
                max_concurrency=1,
                **spec_options(spec, draft_tokens, lm_head_draft, draft_model),
                int8_prefill=int8_prefill,
                vision=vision,
                mmproj=mmproj,
                rope_scaling=rope_scaling,
                chat_template=chat_template,
                chat_template_kwargs=template_kwargs,
                generation_config=generation_config,
                lora_modules=adapters,
            )
        backend = LocalChat(llm)
        if adapters:
            backend.description += f", LoRA adapter {adapters[0][0]}"
        # flags given, then the model's recommended sampling (--generation-config), then greedy
        sampling = {**CHAT_SAMPLING, **llm.sampling_defaults, **given}
        if adapters:
            sampling["adapter"] = adapters[0][0]
    params = SamplingParams(max_tokens=max_tokens, seed=seed, grammar=grammar, **sampling)
    convo = Conversation(system)
    out = sys.stdout
    if prompt is not None:
        convo.pending = [_read_image(backend, path)[0] for path in image or ()]
        convo.ask(prompt)
        _stream_reply(backend, convo.messages(), params, out, verbose, note_context=False)  # one-shot
        return
    if image:
        raise NinferError("--image goes with --prompt; in the conversation, attach pictures with /image PATH")
    console.print(f"[bold]ninfer chat[/bold] — {backend.description}")
    help_line = HELP_LINE + (" " + IMAGE_HELP if vision or mmproj or url else "")
    console.print(help_line)
    if sys.stdin.isatty():
        from engine.paths import ninfer_home

        read_line = terminal_line_reader(ninfer_home() / "chat_history")
    else:
        read_line = piped_line_reader(out)
    while True:
        try:
            message = read_message(read_line)
        except KeyboardInterrupt:
            message = None
        if message is None:
            out.write("\n")
            return
        text = message.strip()
        if not text:
            continue
        word = text.split(maxsplit=1)[0] if message.startswith("/") and "\n" not in text else ""
        retried = None
        if "\n" in text:  # several lines: kept as typed (indented code), blank lines around them dropped
            text = message.strip("\r\n")
        elif word in ("/exit", "/quit") and word == text:
            return
        elif word in ("/reset", "/clear") and word == text:
            convo.clear()
            console.print("conversation cleared")
            continue
        elif word == "/compact" and word == text:  # the turns replaced by the model's summary of them
            try:
                request = convo.compact_request()
                console.print("[dim]summarising the conversation:[/dim]")
                summary = _stream_reply(backend, request, params, out, verbose, note_context=False)
                console.print(convo.compacted(summary))
            except NinferError as e:
                console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
            continue
        elif word in ("/help", "/?") and word == text:
            console.print(help_line)
            continue
        elif word == "/image":
            path = Path(text.removeprefix("/image").strip()).expanduser()
            try:
                data, said = _read_image(backend, path)
            except NinferError as e:
                console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
                continue
            convo.pending.append(data)
            console.print(f"{said}; now type your message")
            continue
        elif word in SESSION_COMMANDS or (word == "/retry" and word == text):
            try:
                if word == "/retry":
                    retried = convo.retry()
                    if url is None and not params.temperature:  # (a server samples by its own defaults)
                        console.print(
                            "[dim]greedy sampling gives the same reply; --temperature 0.7 varies it[/dim]"
                        )
                else:
                    console.print(
                        convo.command(word, text[len(word) :].strip()), markup=False, soft_wrap=True
                    )
                    continue
            except NinferError as e:
                console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
                continue
        elif COMMAND.fullmatch(text) and message.startswith("/"):  # a mistyped command is no message
            console.print(
                f"unknown command {text}; /help lists them (start the line with a space to send it)"
            )
            continue
        if retried is None:
            convo.ask(text)
        try:
            reply = _stream_reply(backend, convo.messages(), params, out, verbose)
        except NinferError as e:  # e.g. the conversation outgrew the context: say so, keep the session
            if retried is None:
                convo.unask()
            else:
                convo.put_back(retried)
            console.print(f"[red]error:[/red] {escape(str(e))} (try /compact or /reset)", soft_wrap=True)
            continue
        convo.answered(reply)


def structured_output(json_schema: str | None, grammar_file: Path | None) -> tuple[str | None, dict]:
    """(the grammar for a local engine, the request fields that ask a server for the same)."""
    from engine.structured import grammars

    if json_schema is not None and grammar_file is not None:
        raise NinferError("give --json-schema or --grammar-file, not both: each holds the whole reply")
    if json_schema is not None:
        path = Path(json_schema)
        text = (
            path.read_text() if not json_schema.lstrip().startswith("{") and path.is_file() else json_schema
        )
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as e:
            raise NinferError(
                f"--json-schema is not JSON (or a file holding JSON): {e.msg} at column {e.colno}"
            ) from e
        fields = {
            "response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
        }
        return grammars.json_schema(schema), fields
    if grammar_file is not None:
        if not grammar_file.is_file():
            raise NinferError(f"--grammar-file {grammar_file} is not a file")
        text = grammar_file.read_text()
        return grammars.grammar(text), {"structured_outputs": {"grammar": text}}
    return None, {}


def _read_image(backend, path: Path) -> tuple[bytes, str]:
    """A picture's bytes, checked by the backend (an engine without its tower refuses here), and what the
    backend says of it."""
    if not path.is_file():
        raise NinferError(f"{path} is not a file; give the path of a PNG, JPEG, WebP, GIF or BMP image")
    data = path.read_bytes()
    return data, backend.attach(data)
