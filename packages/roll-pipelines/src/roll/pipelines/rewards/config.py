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
    correct_weight: float = 1.0
    format_weight: float = Field(default=0.0, ge=0.0)
    timeout_s: float = Field(default=5.0, gt=0.0)
    num_workers: int = Field(default=2, ge=1)
    start_method: Literal["forkserver", "spawn", "fork"] = "forkserver"
    think_end: str = "</think>"


class SandboxConfig(RollModel):
    """Limits of one sandboxed run. See :mod:`roll.pipelines.rewards.sandbox` for what each one guarantees."""

    wall_timeout_s: float = Field(default=5.0, gt=0.0)
    cpu_time_s: int = Field(default=4, ge=1)
    memory_mb: int = Field(default=1024, ge=64)
    file_size_mb: int = Field(default=16, ge=1)
    max_processes: int = Field(default=16, ge=1)
    max_open_files: int = Field(default=64, ge=16)
    max_output_bytes: int = Field(default=256_000, ge=1024)
    python: str | None = None
    """Interpreter for untrusted code; ``None`` picks one the sandbox user can execute."""
    network_namespace: bool = True
    """Run in a fresh network (and pid) namespace via ``unshare`` when the host allows it."""
    filesystem_jail: bool = True
    """Run in a mount namespace that shows only the interpreter's files, read-only (hides the host's files)."""
    require_isolation: bool = False
    """Refuse to build the sandbox unless namespaces, the filesystem jail and an unprivileged uid all hold."""
    allow_unisolated: bool = False
    """Where no jail can be built (no namespaces: a container without CAP_SYS_ADMIN, user namespaces off),
    building the sandbox fails unless this is true; then programs run without namespaces or jail, as
    ``sandbox_uid`` when the parent is root (else as the parent's uid), behind the in-process guard only."""
    drop_privileges: bool = True
    """When the parent runs as root, run the program as ``sandbox_uid`` (root ignores RLIMIT_NPROC)."""
    sandbox_uid: int = 65534
    harness_uid: int = 65533
    """With ``drop_privileges`` as root, the uid of the test harness (see :mod:`._sandbox_boot`): another
    unprivileged uid, so the program can neither signal nor trace it."""
    audit_hook: bool = True
    """The in-process guard; turn off only to test that the kernel layers hold on their own."""
    workdir_root: str | None = None

    @model_validator(mode="after")
    def _distinct_uids(self) -> SandboxConfig:
        if self.harness_uid == self.sandbox_uid:
            raise ValueError(f"harness_uid and sandbox_uid must differ (both {self.sandbox_uid})")
        return self


class CodeRewardConfig(RollModel):
    """Runs each response against its test cases; the score is the fraction passed (or 0/1). Assert cases of
    one response run in one sandbox run, so ``sandbox.wall_timeout_s`` and ``cpu_time_s`` cover them all."""

    sandbox: SandboxConfig = SandboxConfig()
    all_or_nothing: bool = False
    max_concurrency: int = Field(default=2, ge=1)
    extract_code_block: bool = True
    """Take the last fenced code block of the response (```python ...```), else the whole response."""


class JudgeRewardConfig(RollModel):
    """An OpenAI-compatible ``/v1/chat/completions`` judge. The key is read from ``$api_key_env`` at build."""

    base_url: str
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"
    prompt_template: str = DEFAULT_JUDGE_TEMPLATE
    score_mode: Literal["scale", "yes_no"] = "scale"
    max_score: float = Field(default=10.0, gt=0.0)
    max_concurrency: int = Field(default=8, ge=1)
    max_retries: int = Field(default=3, ge=0)
    backoff_base_s: float = Field(default=0.5, ge=0.0)
    backoff_max_s: float = Field(default=8.0, ge=0.0)
    request_timeout_s: float = Field(default=30.0, gt=0.0)
    breaker_failures: int = Field(default=8, ge=0)
    """After this many items in a row fail on retryable errors, the rest of the batch fails at once (0: never)."""
    temperature: float = 0.0
    max_tokens: int = Field(default=512, ge=1)


class IFEvalRewardConfig(RollModel):
    """Strict IFEval checking; ``all_or_nothing`` gives 1 only when every instruction is followed."""

    all_or_nothing: bool = False


class ArithmeticRewardConfig(RollModel):
    """Exact match against a built-in task's answer, via that task's own ``verify``."""

    task: str = "arithmetic"


class ReasoningGymRewardConfig(RollModel):
    """reasoning-gym's own checker on rows from ``reasoning_gym:<task>`` sources (see
    :mod:`roll.pipelines.rewards.reasoning_gym`). ``extract`` says where the answer is in a response:
    ``answer_is``: after the last "answer is" (the SFT format of those sources), ``answer_tag``: inside the last
    ``<answer>...</answer>``, ``none``: the whole response."""

    extract: Literal["answer_is", "answer_tag", "none"] = "answer_is"
    correct_at: float = Field(1.0, gt=0.0, le=1.0, description="scores at least this count as correct")


class RewardModelRewardConfig(RollModel):
    """A sequence-classification reward model scoring each (prompt, response): roll's ``reward_model`` export
    (``<output_dir>/hf``) or any ``AutoModelForSequenceClassification`` folder or hub id. It loads once per
    reward worker, so the domain's ``workers`` are its Ray workers. See :mod:`roll.pipelines.rewards.reward_model`.
    """

    path: str = Field(min_length=1)
    template: str | None = Field(None, description="chat template name; None: the tokenizer's own")
    batch_size: int = Field(16, ge=1)
    max_length: int = Field(2048, ge=8, description="longer conversations keep their last tokens")
    scale: float = 1.0
    shift: float = 0.0
    correct_above: float | None = Field(None, description="info['correct'] = score > this, when set")
    device: Literal["cpu", "cuda", "auto"] = "auto"


class LocalJudgeRewardConfig(RollModel):
    """An LLM judge that the run serves itself: ``model`` (a path roll loads: export folder, hub id, tiny preset)
    is loaded in the reward domain's own Ray workers (give them GPUs with ``workers.gpus_per_worker``) and
    answers greedily; no HTTP endpoint. Prompt and score parsing are ``llm_judge``'s. See
    :mod:`roll.pipelines.rewards.local_judge`."""

    model: str = Field(min_length=1)
    prompt_template: str = DEFAULT_JUDGE_TEMPLATE
    score_mode: Literal["scale", "yes_no"] = "scale"
    max_score: float = Field(default=10.0, gt=0.0)
    max_new_tokens: int = Field(64, ge=1)
    batch_size: int = Field(8, ge=1)
    max_prompt_tokens: int = Field(2048, ge=8)
    device: Literal["cpu", "cuda", "auto"] = "auto"
