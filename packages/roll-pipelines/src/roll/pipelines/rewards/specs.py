"""The :class:`roll.core.types.RewardSpec` of each verifiable reward, for the ``roll.reward`` entry points.

Light on purpose: this module imports only the config models (and the stdlib-only python and exact-match
rewards); each ``build`` imports its reward module (math-verify,
httpx, the sandbox) when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roll.core.types import RewardSpec
from roll.pipelines.rewards.config import (
    ArithmeticRewardConfig,
    CodeRewardConfig,
    IFEvalRewardConfig,
    JudgeRewardConfig,
    LocalJudgeRewardConfig,
    MathRewardConfig,
    ReasoningGymRewardConfig,
    RewardModelRewardConfig,
)
from roll.pipelines.rewards.exact import ExactMatchConfig, ExactMatchReward
from roll.pipelines.rewards.python import PythonReward, PythonRewardConfig

if TYPE_CHECKING:
    from roll.pipelines.rewards.arithmetic import ArithmeticReward
    from roll.pipelines.rewards.code import CodeReward
    from roll.pipelines.rewards.ifeval import IFEvalReward
    from roll.pipelines.rewards.judge import JudgeReward
    from roll.pipelines.rewards.local_judge import LocalJudgeReward
    from roll.pipelines.rewards.math import MathReward
    from roll.pipelines.rewards.reasoning_gym import ReasoningGymReward
    from roll.pipelines.rewards.reward_model import RewardModelReward


def build_math(config: MathRewardConfig) -> MathReward:
    from roll.pipelines.rewards.math import MathReward

    return MathReward(config)


def build_code(config: CodeRewardConfig) -> CodeReward:
    from roll.pipelines.rewards.code import CodeReward

    return CodeReward(config)


def build_judge(config: JudgeRewardConfig) -> JudgeReward:
    from roll.pipelines.rewards.judge import JudgeReward

    return JudgeReward(config)


def build_ifeval(config: IFEvalRewardConfig) -> IFEvalReward:
    from roll.pipelines.rewards.ifeval import IFEvalReward

    return IFEvalReward(config)


def build_arithmetic(config: ArithmeticRewardConfig) -> ArithmeticReward:
    from roll.pipelines.rewards.arithmetic import ArithmeticReward

    return ArithmeticReward(config)


def build_reasoning_gym(config: ReasoningGymRewardConfig) -> ReasoningGymReward:
    from roll.pipelines.rewards.reasoning_gym import ReasoningGymReward

    return ReasoningGymReward(config)


def build_reward_model(config: RewardModelRewardConfig) -> RewardModelReward:
    from roll.pipelines.rewards.reward_model import RewardModelReward

    return RewardModelReward(config)


def build_local_judge(config: LocalJudgeRewardConfig) -> LocalJudgeReward:
    from roll.pipelines.rewards.local_judge import LocalJudgeReward

    return LocalJudgeReward(config)


def build_python(config: PythonRewardConfig) -> PythonReward:
    return PythonReward(config)


def build_exact_match(config: ExactMatchConfig) -> ExactMatchReward:
    return ExactMatchReward(config)


MATH = RewardSpec("math", build_math, MathRewardConfig, "math-verify equivalence of the final boxed answer")
CODE_SANDBOX = RewardSpec(
    "code_sandbox", build_code, CodeRewardConfig, "fraction of test cases a program passes"
)
LLM_JUDGE = RewardSpec("llm_judge", build_judge, JudgeRewardConfig, "an OpenAI-compatible LLM judge")
IFEVAL = RewardSpec("ifeval", build_ifeval, IFEvalRewardConfig, "fraction of IFEval instructions followed")
ARITHMETIC = RewardSpec(
    "arithmetic", build_arithmetic, ArithmeticRewardConfig, "exact match for built-in tasks"
)

PYTHON = RewardSpec(
    "python", build_python, PythonRewardConfig, "a plain Python function: module:name or file.py:name"
)
EXACT_MATCH = RewardSpec(
    "exact_match", build_exact_match, ExactMatchConfig, "normalized exact match, optionally after a regex"
)

REASONING_GYM = RewardSpec(
    "reasoning_gym",
    build_reasoning_gym,
    ReasoningGymRewardConfig,
    "reasoning-gym's own checker for reasoning_gym:<task> data",
)

REWARD_MODEL = RewardSpec(
    "reward_model",
    build_reward_model,
    RewardModelRewardConfig,
    "a sequence-classification reward model (roll's reward_model export or any HF folder)",
)

LLM_JUDGE_LOCAL = RewardSpec(
    "llm_judge_local",
    build_local_judge,
    LocalJudgeRewardConfig,
    "an LLM judge served by the run's own reward workers (no HTTP endpoint)",
)
