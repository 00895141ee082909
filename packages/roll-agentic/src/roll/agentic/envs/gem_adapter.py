"""Any GEM environment (``gem-llm``, extra ``roll-agentic[gem]``) as a roll :class:`~roll.agentic.types.Env`.

``env_id`` is a GEM registry id: ``game:GuessTheNumber-v0-easy``, ``game:Sudoku-v0-easy``, ``math:GSM8K``,
``qa:HotpotQA``, ``rg:chain_sum`` ... (``gem.print_envs()`` lists them; dataset-backed ids need their data, which
this machine cannot download). ``tools: [python]`` wraps the env in GEM's own ``ToolEnvWrapper`` with its
``PythonCodeTool``, so code in ``<python>...</python>`` runs and its output comes back as the observation.

The mapping is one-to-one: GEM's ``reset(seed)`` and ``step(action) -> (obs, reward, terminated, truncated,
info)`` already follow gymnasium's conventions, so the adapter passes the model's raw text as the action (GEM envs
parse their own answer format, ``\\boxed{...}`` for the games), returns GEM's observation, reward, flags and info
unchanged, and adds only what roll reads: ``truncated`` also becomes true at roll's ``max_steps`` (a turn cap of
roll's own, beside GEM's), and ``info["success"]`` is set, when GEM does not set it, to ``terminated and not
truncated and reward >= success_reward``.

Named answers (optional): ``answers: ["1", ..., "10"]`` with ``answer_format: "\\boxed{{{answer}}}"`` makes the
env advertise ``Valid actions: 1, ..., 10``, so roll's env manager parses the model's ``<answer>`` tag into one of
them and the warm-up can teach the format; the adapter sends ``answer_format`` of that answer to GEM. A text that
names no answer goes to GEM unchanged, and GEM applies its own format penalty.

Note that GEM seeds with ``gem.utils.seeding.set_seed``, which seeds the
process-wide ``random`` and numpy RNGs: the adapter cannot make two GEM envs in one process independent.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from roll.agentic.types import EnvConfig, EnvError, Frame, Observation, RenderMode, StepResult
from roll.core.errors import PluginError

DEFAULT_SYSTEM_PROMPT = (
    "You are playing a text environment. Read each observation, follow its instructions and answer in the "
    "format they ask for."
)


class GemEnvConfig(EnvConfig):
    """A GEM env by id; ``env_kwargs`` go to ``gem.make`` (e.g. ``{max_turns: 8}``)."""

    type: Literal["gem"] = Field("gem", description="selects this env (its roll.env entry point)")
    env_id: str = Field(min_length=1, description="GEM registry id, e.g. game:GuessTheNumber-v0-easy")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="gem.make keyword arguments")
    tools: list[Literal["python"]] = Field(default_factory=list, description="GEM tools to wrap the env with")
    max_tool_uses: int = Field(5, ge=1, description="tool calls allowed per episode (with tools)")
    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, description="the system message of every episode")
    success_reward: float = Field(
        1.0, description="a terminating step with at least this reward is a success"
    )
    max_steps: int = Field(default=20, ge=1, description="steps after which the episode is truncated")
    answers: list[str] | None = Field(
        None, min_length=2, description="named answers the env advertises as its valid actions"
    )
    answer_format: str = Field(
        "{answer}", description="what GEM receives for a named answer, e.g. '\\boxed{{{answer}}}'"
    )

    @model_validator(mode="after")
    def _format_names_the_answer(self) -> Self:
        if "{answer}" not in self.answer_format:
            raise ValueError(f"answer_format {self.answer_format!r} must contain '{{answer}}'")
        return self


def import_gem() -> Any:
    try:
        import gem
    except ImportError as exc:
        raise PluginError(
            f"env 'gem' needs the gem-llm package ({exc}): pip install 'roll-agentic[gem]'"
        ) from exc
    return gem


class GemEnv:
    """Adapter around one ``gem.make(env_id)`` instance (see the module docstring for the mapping)."""

    def __init__(self, config: GemEnvConfig) -> None:
        self.config = config
        self.max_steps = config.max_steps
        gem = import_gem()
        try:
            env = gem.make(config.env_id, **config.env_kwargs)
        except ValueError as exc:  # GEM's "not found in registry"
            raise EnvError(f"{exc}; gem.print_envs() lists the ids") from exc
        if config.tools:
            from gem.tools.python_code_tool import PythonCodeTool
            from gem.tools.tool_env_wrapper import ToolEnvWrapper

            env = ToolEnvWrapper(env, tools=[PythonCodeTool()], max_tool_uses=config.max_tool_uses)
        self.env = env
        self._steps = 0
        self._done = True
        self._observation = ""

    @property
    def system_prompt(self) -> str:
        answers = self.config.answers
        if not answers:
            return self.config.system_prompt
        example = f"<answer>{answers[0]}</answer>"
        return f"{self.config.system_prompt}\n{self.action_space_text}. Answer with one, e.g. {example}."

    @property
    def action_space_text(self) -> str:
        if self.config.answers:
            return "Valid actions: " + ", ".join(self.config.answers)
        return f"Answer as the {self.config.env_id} instructions say."

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed)
        self._steps, self._done, self._observation = 0, False, str(observation)
        return self._observation, dict(info)

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError(f"step() on a finished {self.config.env_id} episode; call reset()")
        if self.config.answers and action in self.config.answers:
            action = self.config.answer_format.format(answer=action)
        observation, reward, terminated, truncated, info = self.env.step(action)
        self._steps += 1
        truncated = bool(truncated) or (not terminated and self._steps >= self.max_steps)
        info = dict(info)
        info.setdefault(
            "success", bool(terminated) and not truncated and float(reward) >= self.config.success_reward
        )
        self._done = bool(terminated) or truncated
        self._observation = str(observation)
        return StepResult(self._observation, float(reward), bool(terminated), truncated, info)

    def render(self, mode: RenderMode = "text") -> Frame:
        if mode != "text":
            raise EnvError(f"GEM envs are text only; render mode {mode!r} is not available")
        return self._observation

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
