"""Run a batch of prompts at once and time every token: in process (the engine's step loop) or over HTTP
(the OpenAI streaming protocol, so vLLM, SGLang and llama-server are measured the same way).

A request's record: prompt tokens, cached tokens, generated tokens, t_start / t_first / t_last and the
arrival time of each streamed chunk (perf_counter seconds).

Cold-cache proof over HTTP: the reply's `usage.prompt_tokens_details.cached_tokens` (or llama-server's
`timings.cache_n`); where a server reports neither (vLLM without --enable-prompt-tokens-details, SGLang
without --enable-cache-report), the difference of its prefix-cache hit counter on /metrics across the run
(ninfer's, vLLM's or SGLang's name), given to the run's first request; with neither, the request's
`cache_proof` is None and its row says so.
"""

from __future__ import annotations

import functools
import http.client
import json
import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from engine.bench.workloads import Prompt
from engine.errors import NinferError

log = logging.getLogger("ninfer")
READY_WAIT_S = 600  # how long a server answering 503 (its model loading) is waited for
# the /metrics counters a run's difference is read from, by what they count: ninfer's name, then vLLM's
# (and SGLang's, for the cache)
COUNTERS = {
    "draft_tokens": ("ninfer_spec_draft_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
    "accepted_tokens": ("ninfer_spec_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"),
    "cache_hits": (
        "ninfer_prefix_cache_hit_tokens_total",
        "vllm:prefix_cache_hits_total",
        "sglang:cached_tokens_total",
    ),
}


@dataclass
class Timing:
    prompt_tokens: int
    cached_tokens: int | None  # None: the server did not say
    generated: int
    t_start: float
    t_first: float
    t_last: float
    chunk_times: list[float] = field(default_factory=list)
    spec_acceptance: float | None = None  # accepted / drafted tokens, when the server reports it
    spec_accepted: int | None = None  # the request's accepted draft tokens, where reported per request
    error: str | None = None
    # where cached_tokens comes from: "engine" (in process), "response" (the reply's usage or timings),
    # "metrics" (the server's prefix-cache counter across the run); None: nowhere, a warm cache not ruled out
    cache_proof: str | None = None
    # the server was asleep when the run began (llama-server's and ninfer's --sleep-idle-seconds, vLLM's
    # sleep mode) and a request before it did not wake it: the run's first token waited for the wake
    woke: bool = False

    @staticmethod
    def failed(t_start: float, error: str) -> Timing:
        """A request that ended without a token."""
        return Timing(0, 0, 0, t_start, t_start, t_start, error=error, cache_proof="engine")


def sampling(gen: int, temperature: float, stream: int) -> dict:
    """A benchmark request's sampling fields, as SamplingParams and the OpenAI protocol both take them: `gen`
    tokens whatever the model says (ignore_eos: vLLM, SGLang, llama-server and ninfer honour it), greedy at
    temperature 0, else sampled and seeded by the request's stream, so two runs draw alike."""
    fields = {"max_tokens": gen, "temperature": temperature, "ignore_eos": True}
    return {**fields, "seed": stream} if temperature > 0 else fields


class InProcess:
    """The engine itself: prompts enter as token ids, so the count is exactly the target."""

    def __init__(self, llm):
        self.llm = llm
        self.tokenizer = llm.tokenizer

    def count(self, messages, tools) -> int:
        return len(self.ids(messages, tools))

    def ids(self, messages, tools) -> list[int]:
        return self.tokenizer.encode_chat(messages, tools, True, enable_thinking=False)

    def run(self, prompts: list[Prompt], gen: int, temperature: float = 0.0) -> list[Timing]:
        from engine.request import SamplingParams

        # sampled: the checkpoint's other recommended fields (top-p, top-k, ...) too, as a ninfer server
        # fills in what a request leaves out
        defaults = {k: v for k, v in self.llm.sampling_defaults.items() if k != "temperature"}
        rids = []
        t_start = time.perf_counter()
        for i, p in enumerate(prompts):
            fields = {**(defaults if temperature > 0 else {}), **sampling(gen, temperature, i)}
            rids.append(self.llm.add_request(self.ids(p.messages, p.tools), SamplingParams(**fields)))
        # each request's steps that gave it tokens (a speculative step's tokens arrive together, as one
        # streamed chunk of a server does: ITL is between chunks, as vLLM's benchmark counts it)
        times: dict[str, list[float]] = {r: [] for r in rids}
        seen = dict.fromkeys(rids, 0)
        final = {}
        while len(final) < len(rids):
            outs = self.llm.step()
            now = time.perf_counter()
            for out, _ in outs:
                if len(out.token_ids) > seen[out.request_id]:
                    seen[out.request_id] = len(out.token_ids)
                    times[out.request_id].append(now)
                if out.finished:
                    final[out.request_id] = out
        out = []
        for r in rids:
            got, done = times[r], final[r]
            if not got:  # ended without a token (expired waiting for admission, or aborted)
                out.append(Timing.failed(t_start, done.error or "no token generated"))
                continue
            out.append(
                Timing(
                    len(done.prompt_token_ids),
                    done.num_cached_tokens,
                    len(done.token_ids),
                    t_start,
                    got[0],
                    got[-1],
                    got,
                    spec_acceptance=done.num_accepted_tokens / done.num_draft_tokens
                    if done.num_draft_tokens
                    else None,
                    spec_accepted=done.num_accepted_tokens if done.num_draft_tokens else None,
                    error=done.error,
                    cache_proof="engine",
                )
            )
        return out


class OverHttp:
    """An OpenAI-compatible server. Tokens are counted by its /tokenize endpoint (vLLM, ninfer) or
    /apply-template + /tokenize (llama-server)."""

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None, timeout: float = 3600):
        parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise NinferError(f"--url {url} is not an http(s) URL; write e.g. http://127.0.0.1:8000")
        self.scheme, self.host, self.port = parsed.scheme, parsed.hostname, parsed.port
        self.base = parsed.path.rstrip("/").removesuffix("/v1")
        self.api_key, self.timeout = api_key, timeout
        self._chat_tokenize = True  # /tokenize takes chat messages (vLLM, ninfer); else llama-server's way
        status, data = self._wait_ready()
        if model is None and (status != 200 or not data.get("data")):
            raise NinferError(f"GET /v1/models answered {status}; pass --model NAME")
        self.model = model or data["data"][0]["id"]

    def _conn(self):
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _unreachable(self, e: OSError) -> NinferError:
        """What a failed connection says: an untrusted HTTPS certificate apart from a server not there."""
        if isinstance(e, ssl.SSLCertVerificationError):
            return NinferError(
                f"{self.host}:{self.port}'s HTTPS certificate is not trusted ({e.verify_message}); for a "
                "self-signed one, run with SSL_CERT_FILE=CERT.pem (the server's --ssl-certfile)"
            )
        return NinferError(f"cannot reach {self.host}:{self.port} ({e}); is the server running?")

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        conn = self._conn()
        try:
            conn.request(
                method, self.base + path, json.dumps(body) if body is not None else None, self._headers()
            )
            resp = conn.getresponse()
            raw = resp.read()
        except OSError as e:
            raise self._unreachable(e) from e
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return resp.status, {"raw": raw[:200].decode(errors="replace")}

    def _wait_ready(self) -> tuple[int, dict]:
        """GET /v1/models, waited out while the server answers 503 (a model still loading: ninfer and
        llama-server answer so) for up to READY_WAIT_S."""
        deadline = time.monotonic() + READY_WAIT_S
        told = False
        while True:
            status, data = self._request("GET", "/v1/models")
            if status != 503:
                return status, data
            error = data.get("error")
            why = error.get("message") if isinstance(error, dict) else data.get("raw", "no reason given")
            if time.monotonic() >= deadline:
                raise NinferError(
                    f"{self.host}:{self.port} still answers 503 after {READY_WAIT_S} s ({why}); check the "
                    "server's log"
                )
            if not told:
                log.warning("%s:%s answers 503 (%s); waiting until it is ready", self.host, self.port, why)
                told = True
            time.sleep(1)

    def count(self, messages, tools) -> int:
        body = {
            "model": self.model,
            "messages": messages,
            "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        if tools:
            body["tools"] = tools
        if self._chat_tokenize:
            status, data = self._request("POST", "/tokenize", body)
            if status == 200 and "count" in data:
                return int(data["count"])
            self._chat_tokenize = False  # not this server's shape: ask the other way from now on
        status, data = self._request("POST", "/apply-template", {"messages": messages})
        if status == 200 and "prompt" in data:
            status, data = self._request("POST", "/tokenize", {"content": data["prompt"]})
            if status == 200 and "tokens" in data:
                return len(data["tokens"])
        raise NinferError(
            "this server counts no tokens (no /tokenize); prompts cannot be built to an exact length against it"
        )

    def run(self, prompts: list[Prompt], gen: int, temperature: float = 0.0) -> list[Timing]:
        results: list[Timing | None] = [None] * len(prompts)
        barrier = threading.Barrier(len(prompts))

        def one(i: int) -> None:
            barrier.wait()
            results[i] = self._stream(prompts[i], gen, temperature, i)

        asleep = self._asleep() and not self._woken()
        before = self._counters()
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = self._counters()
        delta = {what: after[what] - before[what] for what in after.keys() & before.keys()}
        if delta.get("draft_tokens", 0) > 0 and "accepted_tokens" in delta:  # their acceptance
            rate = delta["accepted_tokens"] / delta["draft_tokens"]
            results = [replace(t, spec_acceptance=rate) if t is not None else t for t in results]
        if "cache_hits" in delta:  # the run's prefix-cache hits, on its first request the reply left unsaid
            hits = int(delta["cache_hits"])
            for i, t in enumerate(results):
                if t is not None and t.cache_proof is None:
                    results[i] = replace(t, cached_tokens=hits, cache_proof="metrics")
                    hits = 0
        if asleep:
            results = [replace(t, woke=True) if t is not None else t for t in results]
        return results  # type: ignore[return-value]

    def _woken(self) -> bool:
        """Wake a sleeping server before a run (a one-token request, as any client's wakes it), so that no
        measured token waits for the wake: whether it is awake now (said in the log either way)."""
        wake = Prompt([{"role": "user", "content": "Hi"}], None, 0, "wake")
        self._stream(wake, 1)
        awake = not self._asleep()
        if awake:
            log.info("the server was asleep: woken by a one-token request before the run")
        else:
            log.warning(
                "the server is asleep and a request did not wake it: the run's first token waits for it"
            )
        return awake

    def _asleep(self) -> bool:
        """Whether the server says it sleeps: GET /is_sleeping (ninfer, vLLM), else /props' is_sleeping
        (llama-server); False where it says neither."""
        for path in ("/is_sleeping", "/props"):
            try:
                status, data = self._request("GET", path)
            except NinferError:
                return False
            if status == 200 and isinstance(data.get("is_sleeping"), bool):
                return data["is_sleeping"]
        return False

    def _counters(self) -> dict[str, float]:
        """COUNTERS the server's /metrics holds (each summed over its labels), by what they count; none
        where it has no /metrics. Read before and after a run: the difference is the run's."""
        conn = self._conn()
        try:
            conn.request("GET", self.base + "/metrics", headers=self._headers())
            resp = conn.getresponse()
            text = resp.read().decode(errors="replace") if resp.status == 200 else ""
        except OSError:
            return {}
        finally:
            conn.close()
        sums: dict[str, float] = {}
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            name = series.partition("{")[0]
            if line.startswith("#") or not name:
                continue
            try:
                sums[name] = sums.get(name, 0.0) + float(value)
            except ValueError:
                continue
        found = {what: next((n for n in names if n in sums), None) for what, names in COUNTERS.items()}
        return {what: sums[name] for what, name in found.items() if name is not None}

    @functools.cached_property
    def takes_progress(self) -> bool:
        """Whether chat completions take llama-server's `return_progress` here: a server whose GET /props
        answers as llama-server's does (llama-server, ninfer). Others are not asked (OpenAI's API refuses a
        field it does not know)."""
        try:
            status, data = self._request("GET", "/props")
        except NinferError:
            return False
        return status == 200 and isinstance(data.get("default_generation_settings"), dict)

    def chat(
        self,
        messages: list[dict],
        sampling: dict,
        usage: dict | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Iterator[str]:
        """Stream one chat reply's text (`ninfer chat --url`): `sampling` holds the request's max_tokens,
        temperature, ... fields. A refusal raises NinferError with the server's own message; leaving the
        loop early closes the connection, which a server takes as a disconnect (ninfer frees the request).
        `usage`: asked for (stream_options) and filled with the server's usage when it sends one.
        `progress(total, processed)`: called for each `prompt_progress` the server sends while it reads a
        long prompt, where it takes `return_progress` (takes_progress)."""
        body = {"model": self.model, "messages": messages, "stream": True, **sampling}
        if usage is not None:
            body["stream_options"] = {"include_usage": True}
        if progress is not None and self.takes_progress:
            body["return_progress"] = True
        conn = self._conn()
        try:
            try:
                conn.request("POST", self.base + "/v1/chat/completions", json.dumps(body), self._headers())
                resp = conn.getresponse()
            except OSError as e:
                raise self._unreachable(e) from e
            if resp.status != 200:
                raw = resp.read()
                try:
                    error = json.loads(raw).get("error") or {}
                    message = error.get("message") if isinstance(error, dict) else str(error)
                except (json.JSONDecodeError, AttributeError):
                    message = None
                raise NinferError(
                    f"the server answered {resp.status}: {message or raw[:200].decode(errors='replace')}"
                )
            for event in _events(resp):
                if event.get("error"):
                    raise NinferError(
                        f"the server stopped the reply: {event['error'].get('message', event['error'])}"
                    )
                if usage is not None and isinstance(event.get("usage"), dict):
                    usage.update(event["usage"])
                read = event.get("prompt_progress")
                if progress is not None and isinstance(read, dict):
                    total, processed = read.get("total"), read.get("processed")
                    if isinstance(total, int) and isinstance(processed, int) and 0 <= processed <= total > 0:
                        progress(total, processed)
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
                    if text:
                        yield text
        finally:
            conn.close()

    def _stream(self, prompt: Prompt, gen: int, temperature: float = 0.0, stream: int = 0) -> Timing:
        body = {
            "model": self.model,
            "messages": prompt.messages,
            **sampling(gen, temperature, stream),
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False},
        }
        if prompt.tools:
            body["tools"] = prompt.tools
        conn = self._conn()
        t_start = time.perf_counter()
        chunks: list[float] = []
        usage: dict = {}
        timings: dict = {}  # llama-server's: cache_n, draft_n, draft_n_accepted
        try:
            conn.request("POST", self.base + "/v1/chat/completions", json.dumps(body), self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read()[:300].decode(errors="replace")
                return Timing.failed(t_start, f"HTTP {resp.status}: {text}")
            for event in _events(resp):
                if event.get("usage"):
                    usage = event["usage"]
                if isinstance(event.get("timings"), dict):
                    timings = event["timings"]
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                        chunks.append(time.perf_counter())
        finally:
            conn.close()
        if not chunks:
            return Timing.failed(t_start, "the stream carried no tokens")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        cached = timings.get("cache_n") if cached is None else cached
        cached = None if cached is None else int(cached)
        drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
        return Timing(
            int(usage.get("prompt_tokens", 0)),
            cached,
            int(usage.get("completion_tokens", len(chunks))),
            t_start,
            chunks[0],
            chunks[-1],
            chunks,
            spec_acceptance=accepted / drafted if drafted and accepted is not None else None,
            spec_accepted=int(accepted) if drafted and accepted is not None else None,
            cache_proof=None if cached is None else "response",
        )


def _events(resp) -> Iterator[dict]:
    """The JSON events of a streamed (server-sent events) response, up to `data: [DONE]`."""
    while line := resp.readline():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)
