"""LLM-as-judge reward over any OpenAI-compatible ``/chat/completions`` endpoint.

``base_url`` follows the OpenAI client convention and includes the version (``http://host:8000/v1``). Each
request fills ``prompt_template`` (``{question}``, ``{reference}``, ``{response}``, ``{max_score}``), and the
judge's reply is parsed: ``scale`` takes the last ``Score: N`` and divides by ``max_score`` (clipped to [0, 1]);
``yes_no`` takes the last standalone yes/no.

Failure policy: 429, 5xx, timeouts and connection errors are retried up to ``max_retries`` times with
exponential backoff and full jitter; a ``Retry-After`` header is honored, capped at ``backoff_max_s`` so one
server cannot stall a training step. Other 4xx and malformed bodies are not retried. An item that still fails
scores 0 with ``info["error"]``; the batch never raises for it. ``request_timeout_s`` bounds each attempt end to
end (httpx's own timeouts are per phase, so a trickling server could otherwise hold a slot forever).

An endpoint that is down must not stall the step by timing out every item in turn: after ``breaker_failures``
items in a row exhaust their retries on retryable errors (connection refused, timeouts, 5xx), the rest of the batch
fails at once with ``info["error"]`` saying the judge is unavailable (a circuit breaker, reset by any success and at
every batch). Each batch with failures logs how many of its items failed, and why.

The API key is read from ``$api_key_env`` once, at construction, kept out of ``repr``, never logged, and
scrubbed from every error string (a hostile or buggy server may echo it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import threading
from collections import Counter
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from roll.core.errors import ConfigError, ConfigIssue
from roll.pipelines.rewards.config import JudgeRewardConfig
from roll.pipelines.rewards.types import RewardRequest, RewardResult

logger = logging.getLogger(__name__)

_SCORE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_RETRYABLE = frozenset({408, 409, 425, 429})


class _JudgeFailure(Exception):
    """One failed attempt; ``retry_after`` is the server's hint in seconds, when it gave one."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable, self.retry_after = retryable, retry_after


def fill_judge_prompt(template: str, request: RewardRequest, max_score: float) -> str:
    """``template`` with ``{question}``, ``{reference}``, ``{response}`` and ``{max_score}`` filled in."""
    return template.format(
        question=request.prompt,
        reference=request.ground_truth,
        response=request.response,
        max_score=max_score,
    )


def parse_judge_score(text: str, mode: str, max_score: float) -> float | None:
    """The normalized score in a judge reply, or ``None`` when it states none."""
    if mode == "yes_no":
        words = _YES_NO.findall(text)
        return None if not words else float(words[-1].lower() == "yes")
    numbers = _SCORE.findall(text)
    return None if not numbers else min(1.0, max(0.0, float(numbers[-1]) / max_score))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _content(response: httpx.Response) -> str:
    try:
        body = response.json()
        content = body["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise _JudgeFailure(f"malformed response body ({type(exc).__name__})", retryable=False) from None
    if not isinstance(content, str):
        raise _JudgeFailure("malformed response body (content is not a string)", retryable=False)
    return content


class _Breaker:
    """Counts items in a row that failed on retryable errors; open once ``threshold`` is reached (0: never)."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.in_a_row = 0
        self.last_error = ""

    @property
    def open(self) -> bool:
        return self.threshold > 0 and self.in_a_row >= self.threshold

    def record(self, error: str | None, retryable: bool) -> None:
        if error is None:
            self.in_a_row = 0
        elif retryable:
            self.in_a_row += 1
            self.last_error = error


class JudgeReward:
    """Scores responses with an LLM judge. ``score`` is sync; inside an event loop, await :meth:`ascore`."""

    def __init__(
        self, config: JudgeRewardConfig, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config
        self._transport = transport  # tests and custom networking; None means httpx's default
        self.__api_key = self._read_key(config.api_key_env)

    @staticmethod
    def _read_key(env: str | None) -> str | None:
        if env is None:
            return None
        key = os.environ.get(env)
        if not key:
            issue = ConfigIssue(
                "api_key_env",
                f"environment variable {env} is not set or empty",
                "export it, or set api_key_env: null",
            )
            raise ConfigError(issues=[issue])
        return key

    def __repr__(self) -> str:
        return f"JudgeReward(base_url={self.config.base_url!r}, model={self.config.model!r})"

    def _scrub(self, text: str) -> str:
        return text.replace(self.__api_key, "***") if self.__api_key else text

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.ascore(requests))
        # Called from a thread that already runs a loop: run ours on a helper thread instead of failing.
        out: list[list[RewardResult]] = []
        worker = threading.Thread(target=lambda: out.append(asyncio.run(self.ascore(requests))))
        worker.start()
        worker.join()
        return out[0]

    async def ascore(self, requests: list[RewardRequest]) -> list[RewardResult]:
        headers = {"Authorization": f"Bearer {self.__api_key}"} if self.__api_key else {}
        limits = httpx.Limits(max_connections=self.config.max_concurrency)
        semaphore = asyncio.Semaphore(self.config.max_concurrency)
        breaker = _Breaker(self.config.breaker_failures)
        async with httpx.AsyncClient(
            headers=headers, timeout=self.config.request_timeout_s, limits=limits, transport=self._transport
        ) as client:
            jobs = (self._score_one(client, semaphore, breaker, r) for r in requests)
            results = list(await asyncio.gather(*jobs))
        failed = [r.info["error"] for r in results if "error" in r.info]
        if failed:
            reasons = ", ".join(f"{n}x {why}" for why, n in Counter(failed).most_common(3))
            logger.warning(
                "judge %s: %d of %d items failed (%s)",
                self.config.base_url,
                len(failed),
                len(results),
                reasons,
            )
        return results

    async def _score_one(
        self,
        client: httpx.AsyncClient,
        semaphore: asyncio.Semaphore,
        breaker: _Breaker,
        request: RewardRequest,
    ) -> RewardResult:
        c = self.config
        prompt = fill_judge_prompt(c.prompt_template, request, c.max_score)
        async with semaphore:
            if breaker.open:
                why = f"judge unavailable: skipped after {breaker.in_a_row} items in a row failed ({breaker.last_error})"
                return RewardResult.unscored(self._scrub(why), kind="judge unavailable", attempts=0)
            reply, attempts, error, retryable = await self._complete(client, prompt)
            breaker.record(error if reply is None else None, retryable)
        if reply is None:
            return RewardResult.unscored(
                self._scrub(error or "unknown error"), kind="judge request failed", attempts=attempts
            )
        value = parse_judge_score(reply, c.score_mode, c.max_score)
        if value is None:
            return RewardResult.failed("no score in judge reply", attempts=attempts, judge_reply=reply[-500:])
        return RewardResult(score=value, info={"judge_score": value, "attempts": attempts})

    async def _complete(
        self, client: httpx.AsyncClient, prompt: str
    ) -> tuple[str | None, int, str | None, bool]:
        """``(reply, attempts, error, retryable)``: the judge's text, or ``None`` and the last error after all
        retries, and whether that error was a retryable one (the endpoint down or overloaded)."""
        error = ""
        for attempt in range(self.config.max_retries + 1):
            try:
                return await self._attempt(client, prompt), attempt + 1, None, False
            except _JudgeFailure as failure:
                error = str(failure)
                if not failure.retryable or attempt == self.config.max_retries:
                    return None, attempt + 1, error, failure.retryable
                delay = self._delay(attempt, failure.retry_after)
                logger.warning("judge attempt %d failed (%s); retrying in %.2fs", attempt + 1, error, delay)
                await asyncio.sleep(delay)
        return None, self.config.max_retries + 1, error, True  # pragma: no cover  (the loop always returns)

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        cap = self.config.backoff_max_s
        if retry_after is not None:
            return min(retry_after, cap)
        return random.uniform(0.0, min(cap, self.config.backoff_base_s * 2**attempt))

    async def _attempt(self, client: httpx.AsyncClient, prompt: str) -> str:
        c = self.config
        body: dict[str, Any] = {
            "model": c.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": c.temperature,
            "max_tokens": c.max_tokens,
        }
        url = c.base_url.rstrip("/") + "/chat/completions"
        try:
            async with asyncio.timeout(c.request_timeout_s):
                response = await client.post(url, json=body)
        except (TimeoutError, httpx.TimeoutException):
            raise _JudgeFailure(f"timeout after {c.request_timeout_s}s", retryable=True) from None
        except httpx.TransportError as exc:
            raise _JudgeFailure(f"connection error ({type(exc).__name__})", retryable=True) from None
        status = response.status_code
        if status in _RETRYABLE or status >= 500:
            raise _JudgeFailure(f"HTTP {status}", retryable=True, retry_after=_retry_after(response))
        if status >= 400:
            raise _JudgeFailure(f"HTTP {status}", retryable=False)
        return _content(response)
