"""Code reward: run a response's program against test cases in the :mod:`~roll.pipelines.rewards.sandbox`.

Test cases come from ``request.metadata`` or, when it has none, from ``request.ground_truth`` as JSON with the
same keys:

- ``"test_cases": [{"input": "...", "output": "..."}, ...]``: the program reads ``input`` on stdin; the case
  passes when it exits 0 and its stdout equals ``output`` (both stripped, trailing spaces per line ignored).
  Each case is its own run.
- ``"asserts": ["assert f(1) == 2", ...]``: Python source run *by the harness* after the program (see
  :mod:`._sandbox_boot`): the program runs in a process of its own and never sees the tests; each test runs in
  the harness with the program's names as remote proxies whose results cross as plain data. A case passes
  only when the harness ran it to the end. So a program that exits early (``sys.exit(0)``, ``os._exit``, an
  ``atexit`` or signal handler, a thread), returns an object that claims to equal anything, patches builtins
  or reads its own file for the tests scores 0 on the cases it did not really pass. An entry may be a whole
  test suite, e.g. HumanEval's ``check`` function followed by ``check(entry_point)``. Tests may pass only plain
  data (or the program's own objects) to the program.

Score: the fraction of cases passed, or 0/1 with ``all_or_nothing`` (which stops at the first failing stdin case).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from roll.pipelines.rewards.config import CodeRewardConfig
from roll.pipelines.rewards.sandbox import Sandbox, SandboxResult
from roll.pipelines.rewards.types import RewardRequest, RewardResult

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class TestCase:
    """An stdin case (``stdin`` and ``expected`` stdout) or, when ``test`` is set, an assert case."""

    __test__ = False  # not a pytest class, despite the name

    stdin: str = ""
    expected: str | None = None
    test: str | None = None


def extract_code(response: str) -> str:
    """The last fenced code block of ``response``, or the whole response when it has none."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def _normalize(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def parse_cases(metadata: Mapping[str, Any], ground_truth: str) -> list[TestCase]:
    """The request's test cases (see the module docstring); ``ValueError`` when there are none or they are bad."""
    source: Mapping[str, Any] = metadata
    if "test_cases" not in metadata and "asserts" not in metadata:
        try:
            source = json.loads(ground_truth) if ground_truth else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"ground_truth is not JSON test cases: {exc}") from exc
        if not isinstance(source, dict):
            raise ValueError("ground_truth JSON must be an object with 'test_cases' or 'asserts'")
    cases = [TestCase(stdin=str(c["input"]), expected=str(c["output"])) for c in source.get("test_cases", [])]
    cases += [TestCase(test=str(line)) for line in source.get("asserts", [])]
    if not cases:
        raise ValueError(
            "no test cases: give metadata 'test_cases' or 'asserts' (or the same as JSON ground_truth)"
        )
    return cases


def case_passed(case: TestCase, result: SandboxResult) -> bool:
    """Whether an stdin case passed: exit 0 in time and the expected stdout."""
    return result.ok and case.expected is not None and _normalize(result.stdout) == _normalize(case.expected)


class CodeReward:
    """Scores responses by running them; requests of a batch run concurrently (``max_concurrency`` threads)."""

    def __init__(self, config: CodeRewardConfig | None = None) -> None:
        self.config = config or CodeRewardConfig()
        self.sandbox = Sandbox(self.config.sandbox)

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        with ThreadPoolExecutor(self.config.max_concurrency) as pool:
            return list(pool.map(self._score_one, requests))

    def _score_one(self, request: RewardRequest) -> RewardResult:
        try:
            cases = parse_cases(request.metadata, request.ground_truth)
        except (ValueError, KeyError, TypeError) as exc:
            return RewardResult.failed(f"bad test cases: {exc}")
        code = extract_code(request.response) if self.config.extract_code_block else request.response
        passed, first_error = self._run_stdin_cases(code, [c for c in cases if c.test is None])
        tests = [c.test for c in cases if c.test is not None]
        if tests and not (self.config.all_or_nothing and first_error):
            more, error = self._run_asserts(code, tests)
            passed, first_error = passed + more, first_error or error
        fraction = passed / len(cases)
        score = float(passed == len(cases)) if self.config.all_or_nothing else fraction
        info: dict[str, Any] = {"passed": passed, "total": len(cases), "correct": passed == len(cases)}
        if first_error:
            info["error"] = first_error
        return RewardResult(score=score, info=info)

    def _run_stdin_cases(self, code: str, cases: list[TestCase]) -> tuple[int, str | None]:
        passed, first_error = 0, None
        for case in cases:
            result = self.sandbox.run(code, case.stdin)
            if case_passed(case, result):
                passed += 1
                continue
            first_error = first_error or _describe(result)
            if self.config.all_or_nothing:
                break
        return passed, first_error

    def _run_asserts(self, code: str, tests: list[str]) -> tuple[int, str | None]:
        run = self.sandbox.run_tests(code, tests)
        passed = sum(verdict is True for verdict in run.verdicts)
        if passed == len(tests):
            return passed, None
        reported = next((e for v, e in zip(run.verdicts, run.errors) if v is False and e), None)
        return passed, reported or _describe(run.result)


def _describe(result: SandboxResult) -> str:
    if result.timed_out:
        return "timeout"
    if result.output_limited:
        return "output limit exceeded"
    if result.exit_code != 0:
        tail = result.stderr.strip().splitlines()[-1:] or [""]
        return f"exit code {result.exit_code}: {tail[0][:200]}"
    return "wrong answer"
