"""Config of the agent gateway (light: pydantic only). See :mod:`roll.agentic.gateway` for what it serves."""

from __future__ import annotations

from pydantic import Field, field_validator

from roll.agentic.tool_parsers import installed_format
from roll.core.config.base import RollModel
from roll.core.config.sampling import SamplingConfig

__all__ = ["GatewayConfig", "GatewaySamplingConfig"]


class GatewaySamplingConfig(SamplingConfig):
    """How the gateway samples every call (the agent_gateway run's ``rollout``, the key path every RL mode
    shares): ``temperature`` and ``top_p`` whatever a request says, a request's ``max_tokens`` honoured up to
    ``max_new_tokens``."""

    max_new_tokens: int = Field(
        64, ge=1, description="tokens a call may generate (caps a request's max_tokens)"
    )


class GatewayConfig(RollModel):
    """The OpenAI-compatible server a rollout's agents talk to, and the limits of what they may ask.

    Sampling is the gateway's, not the agent's: the :class:`GatewaySamplingConfig` it is given (the run's
    ``rollout.temperature`` and ``rollout.top_p``) is what the policy samples with whatever a request says (so
    the recorded log-probs are the ones training needs); a request's ``max_tokens`` is honoured up to
    ``rollout.max_new_tokens``; ``n`` up to ``max_n``.
    """

    port: int = Field(
        0, ge=0, le=65535, description="local port (127.0.0.1 only); 0 picks a free one per rollout worker"
    )
    model_name: str = Field("policy", min_length=1, description="the model id /v1/models lists")
    tool_call_format: str = Field(
        "hermes",
        description="roll.tool_parser plugin: how tools are shown to the model and its calls read (hermes, "
        "qwen3_coder, llama3_json, mistral, ...)",
    )
    max_context_tokens: int = Field(
        2048,
        ge=16,
        description="a call whose prompt plus its max new tokens exceeds this is refused (HTTP 400)",
    )
    max_n: int = Field(8, ge=1, description="the largest n (choices per call) a request may ask for")
    max_calls_per_episode: int = Field(
        16, ge=1, description="model calls one episode may make; later calls are refused (HTTP 429)"
    )
    episode_timeout_s: float = Field(
        120.0, gt=0, description="an episode's deadline: calls after it are refused, the agent is cut off"
    )
    batch_wait_s: float = Field(
        0.01, ge=0, description="how long a call waits for others to share one batched generate"
    )

    _format_installed = field_validator("tool_call_format")(installed_format)
    generate_timeout_s: float = Field(
        300.0, gt=0, description="deadline of one batched generate on the policy's inference workers"
    )
