"""Chat templates: our sandboxed rendering equals transformers' apply_chat_template."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from engine.chat_template import render_chat_template
from engine.errors import NinferError

# A Qwen3-style template (tools in the system turn, <tool_call> JSON, <tool_response>, think blocks,
# enable_thinking), written for this test.
QWEN3_STYLE = """
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools>\\n\\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.reasoning_content %}{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}
{{- message.content or '' }}
{%- for tc in message.tool_calls or [] %}
{%- set fn = tc.function if tc.function else tc %}
{{- '\\n<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' + (fn.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city — in °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
    [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "tool", "content": '{"wind": "low"}'},
        {"role": "user", "content": "Thanks. And ünïcode?"},
    ],
]


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen_prompt", [True, False])
def test_smollm2_template_matches_transformers(default_tokenizer, hf_default_tokenizer, conv, gen_prompt):
    messages = [m for m in CONVERSATIONS[conv] if m["role"] in ("user", "system", "assistant")]
    expected = hf_default_tokenizer.apply_chat_template(
        messages, add_generation_prompt=gen_prompt, tokenize=False
    )
    assert default_tokenizer.apply_chat_template(messages, add_generation_prompt=gen_prompt) == expected


@pytest.fixture(scope="module")
def qwen_style_hf(default_tokenizer):
    return PreTrainedTokenizerFast(
        tokenizer_object=default_tokenizer.backend, eos_token="<|im_end|>", bos_token=None
    )


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("thinking", [False, True])
def test_qwen3_style_template_with_tools_matches_transformers(qwen_style_hf, conv, tools, thinking):
    messages = CONVERSATIONS[conv]
    expected = qwen_style_hf.apply_chat_template(
        messages,
        tools=tools,
        chat_template=QWEN3_STYLE,
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=thinking,
    )
    ours = render_chat_template(
        QWEN3_STYLE,
        messages,
        tools=tools,
        add_generation_prompt=True,
        enable_thinking=thinking,
        eos_token="<|im_end|>",
    )
    assert ours == expected
    if tools:
        assert '"name": "get_weather"' in ours and "°C" in ours
    assert ours.endswith("<think>\n\n</think>\n\n") != thinking


def test_template_errors_are_sentences():
    with pytest.raises(NinferError, match="does not parse"):
        render_chat_template("{% for m in messages %}", [])
    with pytest.raises(NinferError, match="refused these messages: no system"):
        render_chat_template("{{ raise_exception('no system') }}", [])


def test_template_is_sandboxed():
    with pytest.raises(NinferError):
        render_chat_template("{{ messages.__class__.__mro__[1].__subclasses__() }}", [])
