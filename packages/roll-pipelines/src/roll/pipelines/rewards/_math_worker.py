"""The worker side of the math reward: what runs inside its pool processes.

The parent only pickles :func:`verify_answer` by reference, so importing this module is light; the heavy
math-verify import and the first-call warm-up (about 1 s of lazy grammar and sympy set-up) happen in
:func:`warm`, which a worker runs before it takes any item, so start-up is never charged to an item's deadline.
"""

from __future__ import annotations

import logging

Outcome = tuple[bool, str | None]  # (correct, error)

_warmed = False


def as_gold(ground_truth: str) -> str:
    """Bare ground truths (``\\frac12``, ``3``) are boxed so math-verify's LaTeX extractor sees them."""
    if "\\boxed" in ground_truth or "$" in ground_truth:
        return ground_truth
    return "\\boxed{" + ground_truth + "}"


def verify_answer(prediction: str, gold: str) -> Outcome:
    """Parse both sides and compare with math-verify, with its signal-based timeouts disabled.

    Our caller enforces the timeout by killing the process, since math-verify's ``signal.alarm`` fails off the
    main thread.
    """
    from math_verify import parse, verify

    gold_parsed = parse(as_gold(gold), parsing_timeout=None)
    if not gold_parsed:
        return False, f"cannot parse ground truth {gold!r}"
    pred_parsed = parse(prediction, parsing_timeout=None)
    if not pred_parsed:
        return False, "no parsable answer"
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None)), None


def warm() -> None:
    """Import math-verify and run one comparison, once per process (forked workers inherit the flag)."""
    global _warmed
    if _warmed:
        return
    # Timeouts are disabled on purpose (see above); silence math-verify's warning about it.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    verify_answer("\\boxed{x^2+2x+1}", "(x+1)^2")
    _warmed = True
