"""The HTTP side of the gateway: an OpenAI-compatible API on 127.0.0.1, one path prefix per episode.

Routes, under each episode's ``base_url`` (``http://127.0.0.1:<port>/episodes/<i>/v1``):

- ``GET /models``: the one served model (``gateway.model_name``);
- ``POST /chat/completions``: ``messages`` (system/developer/user/assistant with ``tool_calls``/tool), ``tools``,
  ``n``, ``max_tokens`` / ``max_completion_tokens``, ``stream`` (one chunk per choice, then ``[DONE]``);
  tool calls in the answer come back as ``tool_calls`` (:mod:`.formats`);
- ``POST /completions``: ``prompt`` (a string, or token ids), ``n``, ``max_tokens``.

Every request must carry the rollout's API key (``Authorization: Bearer <key>``; 401 otherwise). Refusals that a
retry cannot fix are 403 with an ``error.code`` (``episode_deadline``, ``call_limit``, ``episode_finished``), so
the OpenAI client does not retry them (it retries 408, 429 and 5xx). A prompt over ``max_context_tokens`` is 400.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import threading
import time
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.manager import Generation
from roll.agentic.gateway.config import GatewayConfig, GatewaySamplingConfig
from roll.agentic.gateway.formats import parse_tool_calls_for, render_messages
from roll.agentic.gateway.record import CallRecord, EpisodeLog
from roll.agentic.gateway.sampler import Batcher
from roll.core.errors import DataError, RollError
from roll.core.seeding import derive_seed
from roll.workers.config import SamplingParams

__all__ = ["ApiError", "GatewayServer"]

logger = logging.getLogger(__name__)
_ROUTE = re.compile(r"^/episodes/(\d+)/v1/(models|chat/completions|completions)/?$")
MAX_BODY_BYTES = 8 << 20


class ApiError(RollError, RuntimeError):
    """A request the gateway refuses: ``status`` and OpenAI's ``error`` object (``code``, ``message``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.code, self.message))

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": "invalid_request_error", "code": self.code}}


class _Server(ThreadingHTTPServer):
    request_queue_size = (
        1024  # the default listen backlog (5) refuses connections when many agents start at once
    )
    daemon_threads = True


class GatewayServer:
    """Serves ``episodes`` (set per rollout with :meth:`open_rollout`) from ``batcher`` on 127.0.0.1."""

    def __init__(
        self, config: GatewayConfig, encoder: ChatEncoder, batcher: Batcher, sampling: GatewaySamplingConfig
    ) -> None:
        self.config, self.encoder, self.batcher, self.sampling = config, encoder, batcher, sampling
        self.episodes: dict[int, EpisodeLog] = {}
        self.api_key = ""
        self.seed = 0
        self._httpd = _Server(("127.0.0.1", config.port), _handler_for(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="gateway-http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def base_url(self, episode: int) -> str:
        return f"http://127.0.0.1:{self.port}/episodes/{episode}/v1"

    def open_rollout(self, episodes: list[EpisodeLog], api_key: str, seed: int) -> None:
        """Serve these episodes (and only these) with this key until the next rollout."""
        self.episodes = {e.index: e for e in episodes}
        self.api_key, self.seed = api_key, seed

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # ---- requests -------------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, Any]:
        """``(status, JSON body)`` of one request (``headers`` with lower-case names; the handler only moves bytes)."""
        self._check_key(headers.get("authorization", ""))
        match = _ROUTE.match(path.split("?", 1)[0])
        if match is None:
            raise ApiError(404, "not_found", f"no route {method} {path}; see /episodes/<i>/v1/models")
        episode, route = self._episode(int(match.group(1))), match.group(2)
        if route == "models":
            return 200, {"object": "list", "data": [{"id": self.config.model_name, "object": "model",
                                                     "owned_by": "roll"}]}  # fmt: skip
        if method != "POST":
            raise ApiError(405, "method_not_allowed", f"{route} takes POST")
        request = _json(body)
        if route == "chat/completions":
            return 200, self._chat(episode, request)
        return 200, self._completion(episode, request)

    def _check_key(self, authorization: str) -> None:
        given = authorization.removeprefix("Bearer ").strip()
        if not self.api_key or not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise ApiError(401, "invalid_api_key", "missing or wrong API key (Authorization: Bearer <key>)")

    def _episode(self, index: int) -> EpisodeLog:
        episode = self.episodes.get(index)
        if episode is None:
            raise ApiError(404, "unknown_episode", f"episode {index} is not part of the current rollout")
        return episode

    def _chat(self, episode: EpisodeLog, request: dict[str, Any]) -> dict[str, Any]:
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "invalid_messages", "'messages' must be a non-empty list")
        try:
            plain = render_messages(messages, request.get("tools"), self.config.tool_call_format)
            prompt = self.encoder.prompt_ids(plain)
        except (DataError, ValueError, TypeError) as exc:  # the request's messages or tools, not our bug
            raise ApiError(400, "invalid_messages", str(exc)) from None
        gens = self._generate(episode, "chat", prompt, request)
        choices = [self._chat_choice(i, g, request.get("tools")) for i, g in enumerate(gens)]
        return _envelope("chat.completion", self.config.model_name, choices, prompt, gens)

    def _chat_choice(self, index: int, gen: Generation, tools: Any) -> dict[str, Any]:
        parsed = parse_tool_calls_for(self._text(gen), self.config.tool_call_format, tools or None)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        reason = "tool_calls" if parsed.tool_calls else self._finish(gen)
        return {"index": index, "message": message, "finish_reason": reason, "logprobs": None}

    def _completion(self, episode: EpisodeLog, request: dict[str, Any]) -> dict[str, Any]:
        raw = request.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
            raw = raw[0]  # the client's one-prompt list
        if isinstance(raw, str):
            prompt = self.encoder.encode(raw)
        elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            prompt = list(raw)
        else:
            raise ApiError(400, "invalid_prompt", "'prompt' must be one string or one list of token ids")
        gens = self._generate(episode, "completions", prompt, request)
        choices = [
            {"index": i, "text": self._text(g), "finish_reason": self._finish(g), "logprobs": None}
            for i, g in enumerate(gens)
        ]
        return _envelope("text_completion", self.config.model_name, choices, prompt, gens)

    def _generate(
        self, episode: EpisodeLog, endpoint: str, prompt: list[int], request: dict[str, Any]
    ) -> list[Generation]:
        """Check the episode's limits, sample, record; the call's deadline is the episode's."""
        cfg = self.config
        params = self._params(request, len(prompt))
        with episode.lock:  # concurrent calls of one episode still get distinct seeds
            self._admit(episode)
            call, episode.issued = episode.issued, episode.issued + 1
        gens = self.batcher.generate(
            prompt, derive_seed(self.seed, episode.index, call), params,
            timeout_s=min(episode.deadline - time.monotonic(), cfg.generate_timeout_s),
        )  # fmt: skip
        if time.monotonic() > episode.deadline:
            raise ApiError(
                403, "episode_deadline", "the episode's deadline passed while this call was sampled"
            )
        episode.add(CallRecord(endpoint, prompt, gens))
        return gens

    def _admit(self, episode: EpisodeLog) -> None:
        """Refuse (and count) a call the episode may not make; caller holds the episode's lock."""
        cfg, refusal = self.config, None
        if episode.status != "running":
            refusal = ApiError(
                403, "episode_finished", f"episode {episode.index} has ended ({episode.status})"
            )
        elif time.monotonic() > episode.deadline:
            refusal = ApiError(403, "episode_deadline", f"episode {episode.index} passed its deadline "
                               f"(gateway.episode_timeout_s = {cfg.episode_timeout_s})")  # fmt: skip
        elif episode.issued >= cfg.max_calls_per_episode:
            refusal = ApiError(403, "call_limit", f"episode {episode.index} made its "
                               f"{cfg.max_calls_per_episode} calls (gateway.max_calls_per_episode)")  # fmt: skip
        if refusal is not None:
            episode.refused += 1
            raise refusal

    def _params(self, request: dict[str, Any], prompt_len: int) -> SamplingParams:
        cfg, sampling = self.config, self.sampling
        n = request.get("n") or 1
        if not isinstance(n, int) or not 1 <= n <= cfg.max_n:
            raise ApiError(400, "invalid_n", f"n must be an integer in [1, {cfg.max_n}] (gateway.max_n)")
        asked = request.get("max_completion_tokens") or request.get("max_tokens") or sampling.max_new_tokens
        if not isinstance(asked, int) or asked < 1:
            raise ApiError(400, "invalid_max_tokens", "max_tokens must be a positive integer")
        max_new = min(asked, sampling.max_new_tokens)
        if prompt_len + max_new > cfg.max_context_tokens:
            raise ApiError(400, "context_length_exceeded", f"prompt of {prompt_len} tokens + {max_new} new "
                           f"exceeds gateway.max_context_tokens = {cfg.max_context_tokens}")  # fmt: skip
        return SamplingParams(
            n=n, temperature=sampling.temperature, top_p=sampling.top_p, max_new_tokens=max_new
        )

    def _text(self, gen: Generation) -> str:
        ids = gen.ids[:-1] if self.encoder.stopped_on_eos(gen.ids) else gen.ids
        return self.encoder.decode(ids)

    def _finish(self, gen: Generation) -> str:
        return "stop" if self.encoder.stopped_on_eos(gen.ids) else "length"


def _json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the request body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", "the request body must be a JSON object")
    return data


def _envelope(
    kind: str, model: str, choices: list[dict[str, Any]], prompt: list[int], gens: list[Generation]
) -> dict[str, Any]:
    completion = sum(len(g.ids) for g in gens)
    return {
        "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{time.monotonic_ns():x}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion,
                  "total_tokens": len(prompt) + completion},
    }  # fmt: skip


def _stream_chunks(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat completion as ``chat.completion.chunk`` events: one delta per choice, then its finish reason."""
    chunks = []
    for choice in response["choices"]:
        delta = {k: v for k, v in choice["message"].items() if v is not None}
        if "tool_calls" in delta:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
        for d, reason in ((delta, None), ({}, choice["finish_reason"])):
            chunks.append({**{k: response[k] for k in ("id", "created", "model")},
                           "object": "chat.completion.chunk",
                           "choices": [{"index": choice["index"], "delta": d, "finish_reason": reason}]})  # fmt: skip
    return chunks


def _handler_for(server: GatewayServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(413, ApiError(413, "too_large", "request body over 8 MiB").body())
                return
            body = self.rfile.read(length) if length else b""
            try:
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, data = server.handle(method, self.path, headers, body)
            except ApiError as exc:
                self._send(exc.status, exc.body())
                return
            except Exception as exc:  # the policy failed or timed out: the agent sees why, the log too
                logger.warning("gateway: %s %s failed: %s", method, self.path, exc)
                self._send(500, ApiError(500, "server_error", f"{type(exc).__name__}: {exc}").body())
                return
            wants_stream = method == "POST" and _json_flag(body, "stream")
            if wants_stream and data.get("object") == "chat.completion":
                self._send_stream(data)
            else:
                self._send(status, data)

        def _send(self, status: int, data: Any) -> None:
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _send_stream(self, data: dict[str, Any]) -> None:
            events = [f"data: {json.dumps(c)}\n\n" for c in _stream_chunks(data)] + ["data: [DONE]\n\n"]
            payload = "".join(events).encode()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("gateway: " + format, *args)

    return Handler


def _json_flag(body: bytes, key: str) -> bool:
    try:
        return bool(json.loads(body).get(key))
    except (ValueError, AttributeError):
        return False
