"""What the routes share: the engine, the served model's name, the auth key, metrics."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from engine.api.anthropic_diagnostics import CacheDiagnostics
from engine.api.cors import LOCAL_ORIGINS
from engine.api.errors import ApiError
from engine.api.metrics import Metrics
from engine.api.prompt_encoder import PromptEncoder
from engine.api.response_background import BackgroundResponses
from engine.api.response_store import ResponseStore
from engine.async_llm import AsyncLLM
from engine.chat_template import with_system_first
from engine.errors import NinferError
from engine.request import SamplingParams
from engine.tokenizer import Tokenizer
from engine.vision.image import ImageInput
from engine.vision.mrope import widen_placeholders


@dataclass
class ServerState:
    engine: AsyncLLM
    model_id: str
    # the keys a guarded route takes (any one of them); empty: no key needed
    api_keys: tuple[str, ...] = ()
    started: int = field(default_factory=lambda: int(time.time()))
    # set when a shutdown's grace period is over: running streams end with a final error event
    ending: bool = False
    # a request sent a prediction while speculative decoding is off: said once in the log
    prediction_warned: bool = False
    # serve --enable-lora: LoRA adapters may be loaded and unloaded while serving (engine/api/lora_routes.py)
    lora_updates: bool = False
    # the LoRA adapters (name -> scale) a request runs with when it picks none itself, llama-server's way
    # (serve --lora-default; GET / POST /lora-adapters); empty: the base model
    lora_defaults: dict[str, float] = field(default_factory=dict)
    # the origins whose web pages may use the server (serve --allowed-origins; engine/api/cors.py)
    allowed_origins: tuple[str, ...] = LOCAL_ORIGINS
    # the Host names requests may give (serve --allowed-hosts; engine/api/hosts.py); None: any
    allowed_hosts: tuple[str, ...] | None = None

    def __post_init__(self):
        # (built on the first render: engine/api/prompt_encoder.py)
        self.prompt_encoder: PromptEncoder | None = None
        self._encoder_lock = threading.Lock()
        self.metrics = Metrics(self.engine, self.model_id)
        self.responses = ResponseStore()
        self.background = BackgroundResponses(self.responses)  # Responses' background: true
        self.cache_diagnostics = CacheDiagnostics()  # Anthropic's diagnostics.previous_message_id

    @property
    def max_context(self) -> int:
        return self.engine.llm.max_context

    @property
    def sampling_defaults(self) -> dict[str, float | int]:
        """The served model's sampling defaults for fields a request leaves out (--generation-config)."""
        return self.engine.llm.sampling_defaults

    def adapter_for(self, body: dict) -> dict[str, Any]:
        """The LoRA adapters a request runs with, as SamplingParams fields: the one its `model` names (vLLM's
        way; any other name runs the base model, as clients that send their own model names, Claude Code's,
        expect), or the mix its `lora` list gives (llama-server's [{"id": ..., "scale": ...}]: each adapter
        named at its scale, the others left out), else the server's defaults (`lora_defaults`)."""
        slots = self.engine.llm.adapters.slots
        model = body.get("model")
        named = model if isinstance(model, str) and model in slots else None
        if body.get("lora") is not None:
            if named is not None:
                raise ApiError(
                    400,
                    f"'{named}' names a LoRA adapter as the model and 'lora' gives adapters too; use one",
                    "lora",
                )
            return {"adapter_scales": self.lora_scales(body["lora"], "lora")}
        if named is not None:
            return {"adapter": named}
        return {"adapter_scales": {n: s for n, s in self.lora_defaults.items() if n in slots}}

    def lora_scales(self, entries: Any, param: str) -> dict[str, float]:
        """{name: scale} from llama-server's [{"id": adapter id, "scale": number}] (GET /lora-adapters lists
        the ids)."""
        by_id = {slot: name for name, slot in self.engine.llm.adapters.slots.items()}
        if not isinstance(entries, list):
            raise ApiError(400, f'\'{param}\' is a list of {{"id": ..., "scale": ...}} objects', param)
        scales: dict[str, float] = {}
        for entry in entries:
            ident = entry.get("id") if isinstance(entry, dict) else None
            scale = entry.get("scale") if isinstance(entry, dict) else None
            number = isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale)
            if isinstance(ident, bool) or not isinstance(ident, int) or not number:
                raise ApiError(
                    400,
                    f'\'{param}\' takes {{"id": adapter id, "scale": number}} objects; got {entry!r}',
                    param,
                )
            if ident not in by_id:
                listed = ", ".join(f"{slot} ({name})" for slot, name in sorted(by_id.items())) or "none"
                raise ApiError(
                    400,
                    f"'{param}' names LoRA adapter id {ident}, which is not loaded; the ids are: {listed}",
                    param,
                )
            scales[by_id[ident]] = float(scale)
        return scales

    def reply_model(self, params: SamplingParams) -> str:
        """The `model` a reply names: the adapter the request ran with, else the served model."""
        return params.adapter or self.model_id

    def text_tokenizer(self) -> Tokenizer:
        """The tokenizer, for a request that sends text; a model without one takes token ids only."""
        if self.engine.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer, so it takes token ids, not text")
        return self.engine.tokenizer

    def default_max_tokens(self) -> int:
        return max(1, min(4096, self.max_context // 2))

    @property
    def reads_images(self) -> bool:
        """Whether the engine runs a vision tower (--vision, --mmproj): requests' images reach the model."""
        return self.engine.llm.model.visual is not None

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list | None,
        kwargs: dict[str, Any],
        continue_final: bool = False,
        generation_prompt: bool = True,
    ) -> tuple[str, list[int]]:
        """The chat template's text and its token ids. `continue_final`: the last message is an assistant
        turn the reply continues (a prefill): the text ends where its content does, not where the template
        closes the turn.

        NOTE: a route calls it in a worker thread (asyncio.to_thread), as it does any encoding of a
        request's text: a conversation of 250K tokens nothing recent starts takes ~0.5 s to render and
        encode, and on the event loop every running stream's chunks would wait that long
        (benchmarks/long_prompt_stall.py)."""
        text = self.render_text(messages, tools, kwargs, continue_final, generation_prompt)
        return text, self._encoder().encode(text)  # (an agent's last turn's tokens reused)

    def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A request's own prompt text's ids (/v1/completions, llama-server's /completion, Ollama's raw
        generate): through the prompt encoder where the tokenizer adds no tokens of its own (Qwen's adds
        none), so a client that resends its growing ChatML prompt each turn has the last one's tokens
        reused; else the tokenizer's. In a worker thread, as `render`."""
        tokenizer = self.text_tokenizer()
        encoder = self._encoder()
        if add_special_tokens and not encoder.adds_nothing:
            return tokenizer.encode(text, add_special_tokens=True)
        return encoder.encode(text)

    def _encoder(self) -> PromptEncoder:
        tokenizer = self.engine.tokenizer
        with self._encoder_lock:  # (renders run in threads)
            if self.prompt_encoder is None or self.prompt_encoder.tokenizer is not tokenizer:
                self.prompt_encoder = PromptEncoder(tokenizer)
            return self.prompt_encoder

    def render_text(
        self,
        messages: list[dict[str, Any]],
        tools: list | None,
        kwargs: dict[str, Any],
        continue_final: bool = False,
        generation_prompt: bool = True,
    ) -> str:
        """The chat template's text alone (render's, not tokenized)."""
        tok = self.engine.tokenizer
        if self.engine.llm.text_refusal:  # said before the chat template is looked for
            raise ApiError(400, self.engine.llm.text_refusal)
        if tok is None:
            raise ApiError(400, "this model has no tokenizer, so it cannot take chat messages")
        try:
            if not self.reads_images and any(_has_image(m) for m in messages):
                self.engine.llm.vision_or_raise()  # (said before a text-only template fails on the image)
            text = _rendered(tok, messages, tools, generation_prompt and not continue_final, kwargs)
        except NinferError as e:
            raise ApiError(400, str(e)) from e
        except Exception as e:  # noqa: BLE001 - a template error is the request's fault
            raise ApiError(400, f"the chat template could not render these messages ({e})") from e
        return _cut_after_final(text, messages[-1]) if continue_final else text

    def with_images(self, ids: list[int], images: list[ImageInput]) -> list[int]:
        """The prompt as the engine runs it: each image's placeholder widened to its tokens."""
        if not images:
            return ids
        pad = self.engine.llm.model.visual.config.image_token_id
        try:
            return widen_placeholders(ids, images, pad)[0]
        except NinferError as e:
            raise ApiError(400, str(e)) from e


def _rendered(
    tok: Tokenizer, messages: list[dict[str, Any]], tools: list | None, generation_prompt: bool, kwargs: dict
) -> str:
    """The template's text of the conversation; where the template refuses it and takes system messages
    only as one, first (Qwen3.5's and Qwen3.6's), the text of the conversation so placed
    (engine/chat_template.with_system_first), else the refusal as it was."""
    try:
        return tok.apply_chat_template(messages, tools, generation_prompt, **kwargs)
    except NinferError as refusal:
        placed = with_system_first(messages)
        if placed is None:
            raise
        try:
            return tok.apply_chat_template(placed, tools, generation_prompt, **kwargs)
        except NinferError:
            raise refusal from None


def _has_image(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") == "image" for p in content
    )


def _cut_after_final(text: str, final: dict[str, Any]) -> str:
    """The rendered conversation up to the end of its last (assistant) message's content: what the
    template writes after it (the turn's end, a new turn) is dropped, so the reply continues it."""
    content = final.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if final.get("tool_calls"):
        raise ApiError(
            400,
            "the last assistant message holds tool calls, which cannot be continued; end with their results",
        )
    if final.get("role") != "assistant" or not isinstance(content, str) or not content.strip():
        raise ApiError(400, "only a last assistant message with text can be continued (a prefill)")
    at = text.rfind(content.strip())
    if at < 0:
        raise ApiError(
            400,
            "the chat template does not write the last assistant message as given, so it cannot be continued",
        )
    # keep the content's own leading and trailing whitespace where the template kept it
    end = (
        at + len(content.lstrip())
        if text[at : at + len(content.lstrip())] == content.lstrip()
        else at + len(content.strip())
    )
    return text[:end]
