"""An engine double for protocol tests: the replies are scripted text, streamed in small pieces.

It renders prompts with a Qwen-style chat template (tools, tool calls, tool responses, think tags) over
the embedded model's tokenizer, so everything the protocol layer does is real but the model's words.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from dataclasses import replace
from types import SimpleNamespace

from engine.models.loader import default_model_path, open_source
from engine.request import RequestOutput
from engine.scheduler.step_tokens import StepTokens

QWEN_STYLE_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}{% if m.role == 'user' %}<|im_start|>user
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% endif %}{% endfor %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking %}<think>
{% endif %}"""


@functools.lru_cache(maxsize=1)
def _tokenizer():
    return replace(open_source(default_model_path()).tokenizer, chat_template=QWEN_STYLE_TEMPLATE)


class ScriptedStream:
    def __init__(
        self,
        request_id: str,
        output: RequestOutput,
        text: str,
        piece: int,
        delay: float = 0.0,
        pace: float = 0.0,
    ):
        self.request_id, self.output, self.text, self.piece = request_id, output, text, piece
        self.delay = delay  # seconds before the first piece (a prompt's prefill)
        self.pace = pace  # seconds between pieces (decode steps)
        self.aborted = False

    def __aiter__(self):
        return self._run()

    async def _run(self):
        await asyncio.sleep(self.delay)
        pieces = [self.text[i : i + self.piece] for i in range(0, len(self.text), self.piece)] or [""]
        for i, delta in enumerate(pieces):
            await asyncio.sleep(self.pace)
            last = i == len(pieces) - 1
            out = replace(
                self.output,
                text=self.text[: (i + 1) * self.piece],
                token_ids=list(range(i + 1)),
                finish_reason="stop" if last else None,
            )
            yield out, delta

    def abort(self):
        self.aborted = True


class _Model:
    visual = None  # no vision tower


class _Stats:
    max_context = 4096
    sampling_defaults: dict = {}
    model = _Model()
    sleep_level = 0  # awake
    text_refusal = None  # it makes text (engine/llm.LLM.text_refusal)
    rerank_head = None  # not a reranker
    adapters = SimpleNamespace(slots={}, names=[])  # no LoRA adapters (engine/lora/adapters.Adapters)
    engine_config = SimpleNamespace(block_size=16, enable_prefix_caching=True, num_draft_tokens=0)


class ScriptedEngine:
    def __init__(self, replies: list[str], piece: int = 3, delay: float = 0.0, pace: float = 0.0):
        self.tokenizer = _tokenizer()
        self.replies = list(replies)
        self.prompts: list[str] = []
        self.params: list = []  # each request's SamplingParams
        self.piece = piece
        self.delay = delay  # each reply's wait before its first piece
        self.pace = pace  # and between its pieces
        self.streams: list[ScriptedStream] = []
        self.llm = _Stats()
        self.keep_alives: list = []  # each keep-alive the routes set (Ollama's; seconds, None: the server's)
        self.prompt_ids: list[list[int]] = []  # each request's prompt token ids
        self.snapshot_hints: list[tuple[int, ...]] = []  # and its snapshot hints (cache breakpoints)
        self.snapshots_enabled = True  # as a hybrid model's engine: the routes work its hints out
        self.is_running = True
        self._ids = itertools.count()

    async def add_request(
        self,
        prompt_token_ids,
        sampling_params,
        request_id=None,
        prompt=None,
        images=None,
        after=None,
        snapshot_hints=(),
    ):
        tok = self.tokenizer
        self.prompt_ids.append(list(prompt_token_ids))
        self.snapshot_hints.append(tuple(snapshot_hints))
        self.prompts.append(
            tok.decode(prompt_token_ids, skip_special_tokens=False) if tok else str(list(prompt_token_ids))
        )
        self.params.append(sampling_params)
        request_id = request_id or f"scripted-{next(self._ids)}"
        output = RequestOutput(request_id, None, list(prompt_token_ids), [], "", None, "stop")
        stream = ScriptedStream(request_id, output, self.replies.pop(0), self.piece, self.delay, self.pace)
        self.streams.append(stream)
        return stream

    async def keep_alive(self, seconds):
        self.keep_alives.append(seconds)

    def sleeps_at(self):
        return None  # never

    def failing(self):
        return None  # its steps never fail

    def stats(self):
        return {
            "num_running": 0,
            "num_waiting": 0,
            "kv_blocks_total": 1,
            "kv_blocks_free": 1,
            "spec_draft_tokens": 0,
            "spec_accepted_tokens": 0,
            "num_preemptions": 0,
            "prefix_cache_queries": 0,
            "prefix_cache_hits": 0,
            "spec_drafts": 0,
            "sleep_level": 0,
        }

    def step_tokens(self):
        return StepTokens()

    def adapters_in_use(self):
        return [], []

    def info(self):
        return {"device": "cpu", "kv_dtype": "fp32"}

    def shutdown(self):
        pass
