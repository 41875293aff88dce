"""API errors and their two wire shapes (OpenAI and Anthropic)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

# HTTP status -> Anthropic error type
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}
_OPENAI_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "server_error",
}


class ApiError(Exception):
    """A request the server refuses: HTTP status + one sentence (+ the offending parameter, OpenAI's error
    code)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        retry_after: int | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.retry_after = status, message, param, retry_after
        self.code = code
        self.anthropic_message = message


class ContextExceeded(ApiError):
    """A prompt beyond the context limit, worded as each protocol's clients detect it: OpenAI's "This
    model's maximum context length is ..." with code context_length_exceeded (what litellm, aider and
    LangChain look for), Anthropic's "prompt is too long: N tokens > M maximum" (the API's own wording,
    which Claude Code recognises)."""

    def __init__(self, tokens: int, limit: int, images: bool = False):
        fix = (
            "send smaller or fewer images, " if images else ""
        ) + "shorten the conversation or raise --max-context"
        counted = "with its images the prompt is" if images else "the prompt is"
        super().__init__(
            400,
            f"This model's maximum context length is {limit} tokens, but {counted} {tokens} tokens; {fix}",
            code="context_length_exceeded",
        )
        self.anthropic_message = f"prompt is too long: {tokens} tokens > {limit} maximum; {fix}"


def openai_error(e: ApiError) -> JSONResponse:
    kind = _OPENAI_TYPES.get(e.status, "invalid_request_error" if e.status < 500 else "server_error")
    body = {"error": {"message": e.message, "type": kind, "param": e.param, "code": e.code}}
    return JSONResponse(body, status_code=e.status, headers=_headers(e))


def anthropic_error(e: ApiError) -> JSONResponse:
    status = 529 if e.status == 429 else e.status  # a full queue is "overloaded" in Anthropic's protocol
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    body = {"type": "error", "error": {"type": kind, "message": e.anthropic_message}}
    return JSONResponse(body, status_code=status, headers=_headers(e))


def ollama_error(e: ApiError) -> JSONResponse:
    return JSONResponse({"error": e.message}, status_code=e.status, headers=_headers(e))


def error_for_path(path: str, e: ApiError) -> JSONResponse:
    """The error in the shape of the protocol the route speaks (Anthropic's under /v1/messages, Ollama's
    under /api/)."""
    if path.startswith("/v1/messages"):
        return anthropic_error(e)
    return ollama_error(e) if path.startswith("/api/") else openai_error(e)


def _headers(e: ApiError) -> dict[str, str]:
    return {"Retry-After": str(e.retry_after)} if e.retry_after is not None else {}
