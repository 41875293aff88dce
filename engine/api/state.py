"""What the routes share: the engine, the served model's name, the auth key, metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.api.errors import ApiError
from engine.api.metrics import Metrics
from engine.api.response_store import ResponseStore
from engine.async_llm import AsyncLLM
from engine.errors import NinferError
from engine.request import SamplingParams
from engine.tokenizer import Tokenizer
from engine.vision.image import ImageInput
from engine.vision.mrope import widen_placeholders


@dataclass
class ServerState:
    engine: AsyncLLM
    model_id: str
    api_key: str | None = None
    started: int = field(default_factory=lambda: int(time.time()))
    # set when a shutdown's grace period is over: running streams end with a final error event
    ending: bool = False
    # a request sent a prediction while speculative decoding is off: said once in the log
    prediction_warned: bool = False
    # serve --enable-lora: LoRA adapters may be loaded and unloaded while serving (engine/api/lora_routes.py)
    lora_updates: bool = False

    def __post_init__(self):
        self.metrics = Metrics(self.engine)
        self.responses = ResponseStore()

    @property
    def max_context(self) -> int:
        return self.engine.llm.max_context

    @property
    def sampling_defaults(self) -> dict[str, float | int]:
        """The served model's sampling defaults for fields a request leaves out (--generation-config)."""
        return self.engine.llm.sampling_defaults

    def adapter_for(self, body: dict) -> str | None:
        """The LoRA adapter a request runs with: the one its `model` names (vLLM's way); any other name runs
        the base model, as clients that send their own model names (Claude Code's) expect."""
        model = body.get("model")
        return model if isinstance(model, str) and model in self.engine.llm.adapters.slots else None

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
        closes the turn."""
        tok = self.engine.tokenizer
        if self.engine.llm.text_refusal:  # said before the chat template is looked for
            raise ApiError(400, self.engine.llm.text_refusal)
        if tok is None:
            raise ApiError(400, "this model has no tokenizer, so it cannot take chat messages")
        try:
            text = tok.apply_chat_template(
                messages, tools, generation_prompt and not continue_final, **kwargs
            )
        except NinferError as e:
            raise ApiError(400, str(e)) from e
        except Exception as e:  # noqa: BLE001 - a template error is the request's fault
            raise ApiError(400, f"the chat template could not render these messages ({e})") from e
        if continue_final:
            text = _cut_after_final(text, messages[-1])
        return text, tok.encode(text, add_special_tokens=False)

    def with_images(self, ids: list[int], images: list[ImageInput]) -> list[int]:
        """The prompt as the engine runs it: each image's placeholder widened to its tokens."""
        if not images:
            return ids
        pad = self.engine.llm.model.visual.config.image_token_id
        try:
            return widen_placeholders(ids, images, pad)[0]
        except NinferError as e:
            raise ApiError(400, str(e)) from e


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
