"""What a served model can do, in the `capabilities` object of Anthropic's models API (GET /v1/models), so a
client that reads it before it sends (the context window, thinking, compaction) sees this server's answer."""

from __future__ import annotations

from typing import Any

from engine.api.state import ServerState


def _yes(flag: bool) -> dict[str, bool]:
    return {"supported": bool(flag)}


def anthropic_capabilities(state: ServerState) -> dict[str, Any]:
    llm, tok = state.engine.llm, state.engine.tokenizer
    template = (tok.chat_template or "") if tok is not None else ""
    thinks = "<think>" in template  # the Qwen3 templates: thinking on and off by enable_thinking
    no = _yes(False)
    return {
        "batch": no,
        "citations": no,
        "code_execution": no,
        "compaction": {"supported": True, "summarize": _yes(True)},
        "context_management": {
            "supported": True,
            "clear_thinking_20251015": _yes(True),
            "clear_tool_uses_20250919": _yes(True),
            "compact_20260112": _yes(True),
        },
        # output_config.effort is taken and handed to the chat template; the Qwen templates have no levels
        "effort": {"supported": False, "low": no, "medium": no, "high": no, "max": no, "xhigh": no},
        "image_input": _yes(llm.model.visual is not None),
        "pdf_input": _yes(True),  # a PDF document's text (engine/api/documents.py)
        "server_tools": {"supported": False, "code_execution": no, "web_search": no},
        "structured_outputs": _yes(True),
        "thinking": {
            "supported": thinks,
            "types": {
                "adaptive": _yes(thinks),
                "between_tools": no,
                "disabled": _yes(True),
                "enabled": _yes(thinks),
            },
        },
    }
