"""The offline-mode pipeline tests (sft, dpo, reward_model) use ``kill_and_resume`` from ``roll.core.testing``
(loaded by the top ``conftest.py``), which roll-diffusion's tests share."""
