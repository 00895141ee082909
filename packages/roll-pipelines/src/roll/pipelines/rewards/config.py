"""Config models of the verifiable rewards: strict, frozen, import-light (no torch, no Ray, no math-verify).

Kept apart from the reward modules so :mod:`roll.pipelines.rewards.specs` and ``roll validate`` load them in
milliseconds; the heavy imports happen in each spec's ``build``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from roll.core.config.base import RollModel

DEFAULT_JUDGE_TEMPLATE = (
    "You are grading a response to a question against a reference answer.\n\n"
    "Question:\n{question}\n\nReference answer:\n{reference}\n\nResponse:\n{response}\n\n"
    "Rate how correct the response is on a scale of 0 to {max_score}. "
    "End your reply with a line of the form 'Score: <number>'."
)


class MathRewardConfig(RollModel):
    """``score = correct_weight * correct + format_weight * format`` (both sub-scores are 0 or 1).

    The answer is the last ``\\boxed{}`` after ``think_end``; ``no_box`` says what happens without one (see
    :mod:`roll.pipelines.rewards.math`). ``timeout_s`` bounds parsing plus verification of one item, enforced by
    killing the worker process.
    """

    no_box: Literal["last_line", "zero", "anywhere"] = Field(
        "last_line",
        description="without a \\boxed{} answer: 'last_line': the last non-empty line is the answer, alone "
        "(an 'answer is'/'answer:' lead-in, $...$ and a final period allowed), 'zero': score 0, 'anywhere': "
        "math-verify's own extraction over the whole text, which takes the last number or expression it finds "
        "(so 'xx 18 yy 16' scores for 16)",
    )
    bare_answer: bool = Field(
        True,
        description="an answer (boxed or last line) holding plain words besides \\text{...} and function names "
        "scores 0 instead of being searched for a number (math-verify would read 'xx 18 yy 16' as 16)",
    )
    correct_weight: float = Field(1.0, description="score of a correct answer")
    format_weight: float = Field(
        default=0.0, ge=0.0, description="score added when the response has the think_end format"
    )
    timeout_s: float = Field(
        default=5.0, gt=0.0, description="seconds to parse and verify one item; past it the item scores 0"
    )
    num_workers: int = Field(default=2, ge=1, description="verifier processes (items in flight at once)")
    start_method: Literal["forkserver", "spawn", "fork"] = Field(
        "forkserver", description="multiprocessing start method of the verifier processes"
    )
    think_end: str = Field("</think>", description="the answer is read after the last occurrence of this tag")


class SandboxConfig(RollModel):
    """Limits of one sandboxed run. See :mod:`roll.pipelines.rewards.sandbox` for what each one guarantees."""

    wall_timeout_s: float = Field(default=5.0, gt=0.0, description="wall-clock seconds one run may take")
    cpu_time_s: int = Field(default=4, ge=1, description="CPU seconds one run may use (RLIMIT_CPU)")
    memory_mb: int = Field(default=1024, ge=64, description="address space of one run in MiB (RLIMIT_AS)")
    file_size_mb: int = Field(
        default=16, ge=1, description="largest file a run may write, MiB (RLIMIT_FSIZE)"
    )
    max_processes: int = Field(default=16, ge=1, description="processes of the sandbox user (RLIMIT_NPROC)")
    max_open_files: int = Field(default=64, ge=16, description="open file descriptors (RLIMIT_NOFILE)")
    max_output_bytes: int = Field(
        default=256_000, ge=1024, description="stdout plus stderr beyond this kills the run"
    )
    python: str | None = Field(
        None, description="interpreter for untrusted code; unset: one the sandbox user can execute"
    )
    network_namespace: bool = Field(
        True, description="run in a fresh network (and pid) namespace via unshare when the host allows it"
    )
    filesystem_jail: bool = Field(
        True, description="run in a mount namespace showing only the interpreter's files, read-only"
    )
    require_isolation: bool = Field(
        False,
        description="refuse to build unless namespaces, the filesystem jail and an unprivileged uid all hold",
    )
    allow_unisolated: bool = Field(
        False,
        description="where no jail can be built, run programs anyway (unprivileged, behind the in-process guard "
        "only) instead of failing",
    )
    drop_privileges: bool = Field(
        True,
        description="when the parent runs as root, run the program as sandbox_uid (root ignores RLIMIT_NPROC)",
    )
    sandbox_uid: int = Field(65534, description="uid untrusted programs run as when dropping privileges")
    harness_uid: int = Field(
        65533,
        description="uid of the test harness when dropping privileges: another unprivileged uid, so the program "
        "can neither signal nor trace it",
    )
    audit_hook: bool = Field(
        True, description="the in-process guard; turn off only to test that the kernel layers hold alone"
    )
    workdir_root: str | None = Field(
        None, description="folder the per-run temporary work folders are made in; unset: the system temp dir"
    )

    @model_validator(mode="after")
    def _distinct_uids(self) -> SandboxConfig:
        if self.harness_uid == self.sandbox_uid:
            raise ValueError(f"harness_uid and sandbox_uid must differ (both {self.sandbox_uid})")
        return self


class CodeRewardConfig(RollModel):
    """Runs each response against its test cases; the score is the fraction passed (or 0/1). Assert cases of
    one response run in one sandbox run, so ``sandbox.wall_timeout_s`` and ``cpu_time_s`` cover them all."""

    sandbox: SandboxConfig = SandboxConfig()
    all_or_nothing: bool = Field(False, description="score 1 only when every test case passes, else 0")
    max_concurrency: int = Field(default=2, ge=1, description="responses of a batch run at once (threads)")
    extract_code_block: bool = Field(
        True, description="run the last fenced code block of the response; false: the whole response"
    )


class JudgeRewardConfig(RollModel):
    """An OpenAI-compatible ``/v1/chat/completions`` judge. The key is read from ``$api_key_env`` at build."""

    base_url: str = Field(description="the judge server's base URL, e.g. http://host:8000/v1")
    model: str = Field(description="model name sent in each request")
    api_key_env: str | None = Field(
        "OPENAI_API_KEY", description="environment variable holding the API key; unset: no key sent"
    )
    prompt_template: str = Field(
        DEFAULT_JUDGE_TEMPLATE,
        description="judge prompt with {question}, {reference}, {response}, {max_score}",
    )
    score_mode: Literal["scale", "yes_no"] = Field(
        "scale", description="scale: the last 'Score: N' / max_score; yes_no: the last standalone yes or no"
    )
    max_score: float = Field(
        default=10.0, gt=0.0, description="top of the judge's scale (scores are divided by it)"
    )
    max_concurrency: int = Field(default=8, ge=1, description="requests in flight at once")
    max_retries: int = Field(
        default=3, ge=0, description="retries of a 429, 5xx, timeout or connection error"
    )
    backoff_base_s: float = Field(
        default=0.5, ge=0.0, description="first retry's backoff (exponential, jittered)"
    )
    backoff_max_s: float = Field(default=8.0, ge=0.0, description="cap of one backoff, Retry-After included")
    request_timeout_s: float = Field(default=30.0, gt=0.0, description="limit of one attempt, end to end")
    breaker_failures: int = Field(
        default=8,
        ge=0,
        description="after this many items in a row fail on retryable errors, the rest of the batch fails at "
        "once (0: never)",
    )
    temperature: float = Field(0.0, description="the judge's sampling temperature")
    max_tokens: int = Field(default=512, ge=1, description="max tokens of the judge's reply")


class IFEvalRewardConfig(RollModel):
    """Strict IFEval checking; ``all_or_nothing`` gives 1 only when every instruction is followed."""

    all_or_nothing: bool = Field(
        False, description="score 1 only when every instruction is followed; false: the fraction followed"
    )


class ArithmeticRewardConfig(RollModel):
    """Exact match against a built-in task's answer, via that task's own ``verify``."""

    task: str = Field("arithmetic", description="the built-in task whose verify checks answers")


class ReasoningGymRewardConfig(RollModel):
    """reasoning-gym's own checker on rows from ``reasoning_gym:<task>`` sources (see
    :mod:`roll.pipelines.rewards.reasoning_gym`). ``extract`` says where the answer is in a response:
    ``answer_is``: after the last "answer is" (the SFT format of those sources), ``answer_tag``: inside the last
    ``<answer>...</answer>``, ``none``: the whole response."""

    extract: Literal["answer_is", "answer_tag", "none"] = Field(
        "answer_is",
        description="where the answer is: after 'answer is', inside <answer>, or the whole response",
    )
    correct_at: float = Field(1.0, gt=0.0, le=1.0, description="scores at least this count as correct")


class RewardModelRewardConfig(RollModel):
    """A sequence-classification reward model scoring each (prompt, response): roll's ``reward_model`` export
    (``<output_dir>/hf``) or any ``AutoModelForSequenceClassification`` folder or hub id. It loads once per
    reward worker, so the domain's ``workers`` are its Ray workers. See :mod:`roll.pipelines.rewards.reward_model`.
    """

    path: str = Field(min_length=1, description="the reward model: a local folder or hub id")
    template: str | None = Field(None, description="chat template name; None: the tokenizer's own")
    batch_size: int = Field(16, ge=1, description="conversations per scoring forward")
    max_length: int = Field(2048, ge=8, description="longer conversations keep their last tokens")
    scale: float = Field(1.0, description="score = scale * model output + shift")
    shift: float = Field(0.0, description="added after scaling")
    correct_above: float | None = Field(None, description="info['correct'] = score > this, when set")
    device: Literal["cpu", "cuda", "auto"] = Field("auto", description="auto: cuda when available, else cpu")


class LocalJudgeRewardConfig(RollModel):
    """An LLM judge that the run serves itself: ``model`` (a path roll loads: export folder, hub id, tiny preset)
    is loaded in the reward domain's own Ray workers (give them GPUs with ``workers.gpus_per_worker``) and
    answers greedily; no HTTP endpoint. Prompt and score parsing are ``llm_judge``'s. See
    :mod:`roll.pipelines.rewards.local_judge`."""

    model: str = Field(min_length=1, description="the judge model: export folder, hub id or tiny preset")
    prompt_template: str = Field(
        DEFAULT_JUDGE_TEMPLATE,
        description="judge prompt with {question}, {reference}, {response}, {max_score}",
    )
    score_mode: Literal["scale", "yes_no"] = Field(
        "scale", description="scale: the last 'Score: N' / max_score; yes_no: the last standalone yes or no"
    )
    max_score: float = Field(
        default=10.0, gt=0.0, description="top of the judge's scale (scores are divided by it)"
    )
    max_new_tokens: int = Field(64, ge=1, description="max tokens of the judge's greedy reply")
    batch_size: int = Field(8, ge=1, description="judge prompts generated together")
    max_prompt_tokens: int = Field(2048, ge=8, description="judge prompts are truncated to this many tokens")
    device: Literal["cpu", "cuda", "auto"] = Field("auto", description="auto: cuda when available, else cpu")
