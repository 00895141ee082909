"""Every YAML in ``examples/`` names an installed pipeline and validates against its config model.

Runs in the full suite only (it needs every training-mode package installed), so a config key renamed in a
package cannot silently break an example that no end-to-end test runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.core.cli import load_run_config

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_validates(path: Path) -> None:
    spec, config = load_run_config(path, [])
    assert spec.name == config.pipeline
    assert config.max_steps > 0


TRAINED_ROLES = ("actor_train", "student", "critic")


def _trains_a_model_role(path: Path) -> bool:
    from roll.workers.roles.config import TrainRoleConfig

    config = load_run_config(path, [])[1]
    return any(isinstance(getattr(config, r, None), TrainRoleConfig) for r in TRAINED_ROLES)


TRAINING_EXAMPLES = [p for p in EXAMPLES if _trains_a_model_role(p)]
"""Examples with a model role of roll-workers: not smoke (a regression head), rlvr_rollout (evaluates only) or
reward_fl (its denoiser role is roll-diffusion's own, on diffusers)."""


def test_most_examples_train_a_model_role() -> None:
    assert len(TRAINING_EXAMPLES) >= 15 and {"quickstart", "sft", "dpo", "agentic_guess"} <= {
        p.stem for p in TRAINING_EXAMPLES
    }


@pytest.mark.parametrize("path", TRAINING_EXAMPLES, ids=lambda p: p.stem)
def test_megatron_is_selectable_in_every_trained_role(path: Path) -> None:
    """``strategy: {type: megatron, tensor_parallel_size: 2}`` (on twice the workers) validates in every trained role
    of every example
    that trains one (running it needs CUDA; choosing it must not), and an inference strategy there is rejected naming both."""
    from roll.core.config.loader import load_tree, validate
    from roll.core.errors import ConfigError

    spec, config = load_run_config(path, [])
    roles = [r for r in TRAINED_ROLES if r in type(config).model_fields]
    if "critic" in roles and not getattr(config, "needs_critic", False):
        roles.remove("critic")  # a critic section without a critic algorithm is itself an error
    assert roles, f"{path.stem} has no trained role"
    tree = load_tree(path, [])
    for role in roles:
        section = tree.data.setdefault(role, {})
        section["strategy"] = {"type": "megatron", "tensor_parallel_size": 2}
        # TP groups of 2 need twice the workers for the same data-parallel size (checked at load time).
        section["num_workers"] = 2 * section.get("num_workers", 1)
    validated = validate(tree, spec.config_model)
    assert all(getattr(validated, r).strategy.type == "megatron" for r in roles)
    tree.data[roles[0]]["strategy"] = {"type": "vllm"}
    with pytest.raises(
        ConfigError, match=rf"{roles[0]}\.strategy.*'vllm' is an infer strategy.*fsdp2, megatron"
    ):
        validate(tree, spec.config_model)
