"""LLM judge against a fake OpenAI-compatible server on 127.0.0.1 (a ``ThreadingHTTPServer`` in a thread).

The request's ``model`` field picks the server's behavior, so one server serves every scenario.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from roll.core.errors import ConfigError
from roll.pipelines.rewards.config import JudgeRewardConfig
from roll.pipelines.rewards.judge import JudgeReward, parse_judge_score
from roll.pipelines.rewards.types import RewardRequest

SECRET = "sk-test-DO-NOT-LEAK-123456"
CALLS: Counter[str] = Counter()
SEEN_AUTH: list[str] = []
RELEASE = threading.Event()


def _reply(text: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()


class FakeJudge(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model = body["model"]
        CALLS[model] += 1
        SEEN_AUTH.append(self.headers.get("Authorization", ""))
        if model == "flaky" and CALLS[model] == 1:
            self._send(429, b'{"error": "slow down"}', {"Retry-After": "0.1"})
        elif model == "broken":
            self._send(500, f"internal error, your key was {self.headers.get('Authorization')}".encode())
        elif model == "hang":
            RELEASE.wait(timeout=5)  # bounded: the fixture releases it at teardown
            self._send(200, _reply("Score: 10"))
        elif model == "malformed":
            self._send(200, b"this is not json")
        elif model == "yesno":
            self._send(200, _reply("Is it correct? Yes."))
        else:
            self._send(200, _reply("The response is mostly right.\nScore: 7"))


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    RELEASE.set()
    server.shutdown()
    server.server_close()


@pytest.fixture()
def judge_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLL_TEST_JUDGE_KEY", SECRET)


def _judge(base_url: str, model: str, **overrides: object) -> JudgeReward:
    settings: dict[str, object] = {
        "base_url": base_url,
        "model": model,
        "api_key_env": "ROLL_TEST_JUDGE_KEY",
        "max_retries": 2,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.2,
        "request_timeout_s": 2.0,
        **overrides,
    }
    return JudgeReward(JudgeRewardConfig.model_validate(settings))


REQUEST = RewardRequest("Paris", prompt="Capital of France?", ground_truth="Paris")


def test_parse_judge_score() -> None:
    assert parse_judge_score("blah\nScore: 7", "scale", 10) == 0.7
    assert parse_judge_score("Score: 15", "scale", 10) == 1.0
    assert parse_judge_score("**Score:** 3", "scale", 10) == 0.3  # markdown bold around the label
    assert parse_judge_score("no number", "scale", 10) is None
    assert parse_judge_score("Maybe... no.", "yes_no", 10) == 0.0
    assert parse_judge_score("hmm", "yes_no", 10) is None


@pytest.mark.usefixtures("judge_env")
def test_scores_and_sends_the_key(base_url: str) -> None:
    results = _judge(base_url, "ok", max_concurrency=2).score([REQUEST] * 4)
    assert [r.score for r in results] == [0.7] * 4
    assert SEEN_AUTH[-1] == f"Bearer {SECRET}"
    (yes,) = _judge(base_url, "yesno", score_mode="yes_no").score([REQUEST])
    assert yes.score == 1.0


@pytest.mark.usefixtures("judge_env")
def test_429_is_retried_honoring_retry_after(base_url: str) -> None:
    (result,) = _judge(base_url, "flaky").score([REQUEST])
    assert result.score == 0.7 and result.info["attempts"] == 2


@pytest.mark.usefixtures("judge_env")
def test_persistent_500_scores_zero_without_leaking_the_key(
    base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    judge = _judge(base_url, "broken")
    with caplog.at_level(logging.DEBUG):
        (result,) = judge.score([REQUEST])
    assert result.score == 0.0 and result.info["error"] == "HTTP 500" and result.info["attempts"] == 3
    assert CALLS["broken"] == 3
    assert "retrying" in caplog.text
    for text in (str(result.info), caplog.text, repr(judge), str(vars(judge.config))):
        assert SECRET not in text


@pytest.mark.usefixtures("judge_env")
def test_hanging_server_times_out_after_retries(base_url: str) -> None:
    started = time.monotonic()
    (result,) = _judge(base_url, "hang", request_timeout_s=0.3, max_retries=1).score([REQUEST])
    assert result.score == 0.0 and "timeout" in result.info["error"] and result.info["attempts"] == 2
    # a server that is not cut off answers after 5 s, with a score of 10
    assert time.monotonic() - started < 8


@pytest.mark.usefixtures("judge_env")
def test_malformed_body_scores_zero_without_retry(base_url: str) -> None:
    (result,) = _judge(base_url, "malformed").score([REQUEST])
    assert result.score == 0.0 and "malformed" in result.info["error"] and result.info["attempts"] == 1


@pytest.mark.usefixtures("judge_env")
def test_unreachable_server_is_an_error_not_a_crash() -> None:
    (result,) = _judge("http://127.0.0.1:9/v1", "ok", max_retries=1).score([REQUEST])
    assert result.score == 0.0 and "connection error" in result.info["error"]


def test_missing_key_env_is_a_config_error(base_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLL_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(ConfigError, match="ROLL_TEST_JUDGE_KEY"):
        _judge(base_url, "ok")


@pytest.mark.usefixtures("judge_env")
def test_score_works_inside_a_running_event_loop(base_url: str) -> None:
    import asyncio

    async def main() -> list[float]:
        judge = _judge(base_url, "ok")
        return [r.score for r in judge.score([REQUEST])] + [r.score for r in await judge.ascore([REQUEST])]

    assert asyncio.run(main()) == [0.7, 0.7]


@pytest.fixture()
def black_hole() -> Iterator[str]:
    """An endpoint that accepts TCP connections (into the kernel's backlog) and never answers: a hung judge."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    sock.close()


@pytest.mark.usefixtures("judge_env")
def test_a_down_judge_fails_the_batch_fast_with_every_failure_counted(
    black_hole: str, caplog: pytest.LogCaptureFixture
) -> None:
    """64 items, 8 at a time, each attempt timing out at 0.3 s, one retry: without the breaker that is 8 waves of
    >= 0.6 s (about 5 s); with it the breaker opens once 8 items failed in a row. Items start as slots free up,
    so at most 8 + 7 items are tried before it opens (7 more may have started just before): >= 49 fail at once."""
    judge = _judge(black_hole, "ok", request_timeout_s=0.3, max_retries=1, max_concurrency=8)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="roll.pipelines.rewards.judge"):
        results = judge.score([REQUEST] * 64)
    assert time.monotonic() - started < 20  # bounded, not pinned: the count below is what shows the breaker
    assert all(r.score == 0.0 and "error" in r.info for r in results)
    skipped = [r for r in results if r.info["error"].startswith("judge unavailable")]
    assert len(skipped) >= 49 and all("timeout" in r.info["error"] for r in results)
    assert "64 of 64 items failed" in caplog.text
