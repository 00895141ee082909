"""A reward as a plain Python function, for ``examples/rlvr_python_reward.yaml``.

roll calls ``answer_is(response, ground_truth, prompt=..., tag=..., metadata=...)`` once per response; it may
return a number, a bool, or a dict with a ``score`` (other keys are logged as info).
"""

from __future__ import annotations

import re


def answer_is(response: str, ground_truth: str, **kwargs: object) -> dict[str, object]:
    """1.0 when the last "The answer is N" names the ground truth, else 0.0."""
    found = re.findall(r"answer is (-?\d+)", response)
    correct = bool(found) and found[-1] == ground_truth.strip()
    return {"score": float(correct), "correct": correct}
