"""The HTTP server: FastAPI app with the OpenAI and Anthropic routes, auth, errors, health and metrics."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.api import (
    anthropic,
    completions,
    embeddings,
    llama_cpp,
    llama_embedding,
    lora_routes,
    ollama,
    ollama_chat,
    ollama_manage,
    openai,
    props,
    rerank,
    response_compaction,
    responses,
    sleep_routes,
    slots,
    tokens,
)
from engine.api.auth import AuthMiddleware
from engine.api.cors import CorsMiddleware
from engine.api.errors import ApiError, error_for_path
from engine.api.hosts import HostCheckMiddleware
from engine.api.state import ServerState
from engine.version import ninfer_version

log = logging.getLogger("ninfer.api")


def error_response(request: Request, e: ApiError) -> JSONResponse:
    return error_for_path(request.url.path, e)


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="ninfer", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ninfer = state

    guarded_paths = (
        *tokens.PATHS,
        *llama_cpp.PATHS,
        *llama_embedding.PATHS,
        *props.PATHS,
        *slots.PATHS,
        *rerank.PATHS,
        *lora_routes.PATHS,
        *sleep_routes.PATHS,
        "/reset_prefix_cache",
    )

    app.add_middleware(AuthMiddleware, keys=state.api_keys, guarded_paths=guarded_paths)
    app.add_middleware(CorsMiddleware, patterns=state.allowed_origins)  # before auth: preflights need no key
    app.add_middleware(HostCheckMiddleware, patterns=state.allowed_hosts)  # outermost

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return error_response(request, e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        message = "no such endpoint" if e.status_code == 404 else str(e.detail)
        return error_response(
            request, ApiError(e.status_code, f"{message}: {request.method} {request.url.path}")
        )

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        log.exception("internal error on %s", request.url.path)
        return error_response(
            request, ApiError(500, f"internal error ({type(e).__name__}); see the server log")
        )

    @app.get("/health")
    async def health():
        if not state.engine.is_running:
            return JSONResponse({"status": "error", "message": "the engine stopped"}, status_code=503)
        failing = state.engine.failing()
        if failing is not None:
            return JSONResponse({"status": "error", "message": failing}, status_code=503)
        return {"status": "ok", "model": state.model_id}

    @app.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse)
    async def root():  # what Ollama's clients probe for ("Ollama is running"), and a person with a browser
        return (
            f"ninfer is running ({state.model_id}): OpenAI at /v1, Anthropic at /v1/messages, Ollama at /api, "
            "llama.cpp at /completion\n"
        )

    @app.get("/version")
    async def version():
        return {"version": ninfer_version()}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():  # vLLM's: the next requests start cold (benchmarks between runs)
        await state.engine.reset_prefix_cache()
        return Response(status_code=200)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping():  # vLLM's (a load balancer's probe): 200 while the engine runs
        works = state.engine.is_running and state.engine.failing() is None
        return Response(status_code=200 if works else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    app.include_router(openai.router)
    app.include_router(completions.router)
    app.include_router(embeddings.router)
    app.include_router(rerank.router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    app.include_router(response_compaction.router)
    app.include_router(tokens.router)
    app.include_router(llama_cpp.router)
    app.include_router(llama_embedding.router)
    app.include_router(props.router)
    app.include_router(slots.router)
    app.include_router(lora_routes.router)
    app.include_router(sleep_routes.router)
    app.include_router(ollama.router)
    app.include_router(ollama_chat.router)
    app.include_router(ollama_manage.router)
    return app
