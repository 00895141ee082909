"""A calculator tool: arithmetic evaluated by walking Python's AST, never by ``eval``.

Allowed: numbers, ``+ - * / // % **``, unary ``+ -``, parentheses and the functions in :data:`FUNCTIONS`.
Everything else (names, attributes, calls to other functions, comprehensions, strings) is rejected. Integer
literals evaluate as :class:`~fractions.Fraction`, so ``(1/3)*3`` is exactly ``1``; a result is shown as an
integer when it is whole. Bounds on text length, node count, exponent and magnitude keep a hostile expression
from eating memory or time (``9**9**9`` is refused, not computed).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Literal

from pydantic import Field

from roll.agentic.types import ToolResult
from roll.core.config.base import RollModel

__all__ = ["FUNCTIONS", "CalculatorConfig", "CalculatorError", "CalculatorTool", "evaluate", "format_number"]

Number = Fraction | float

MAX_CHARS = 1000
MAX_NODES = 200
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 1e100


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message is meant for the model."""


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "sqrt": math.sqrt,
    "round": round,
    "min": min,
    "max": max,
}


def evaluate(expression: str) -> Number:
    """The value of ``expression``. Raises :class:`CalculatorError` with a readable reason."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"expression has more than {MAX_NODES} parts")
    return _eval(tree.body)


def format_number(value: Number) -> str:
    """``7`` for a whole number, else a short decimal (``0.3333333333``)."""
    if isinstance(value, Fraction) and value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    if as_float.is_integer() and abs(as_float) < 1e15:
        return str(int(as_float))
    return f"{as_float:.10g}"


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        return _constant(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        return _binary(node)
    if isinstance(node, ast.Call):
        return _call(node)
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def _constant(value: object) -> Number:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalculatorError(f"only numbers are allowed, got {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    return _checked(value)


def _binary(node: ast.BinOp) -> Number:
    left, right = _eval(node.left), _eval(node.right)
    try:
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        fn = _BINARY.get(type(node.op))
        if fn is None:
            raise CalculatorError(f"unsupported operator: {type(node.op).__name__}")
        return _checked(fn(left, right))
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("result too large") from None


def _power(base: Number, exponent: Number) -> Number:
    size = abs(float(exponent))
    if size > MAX_EXPONENT:
        raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
    if size * abs(math.log10(abs(float(base)) or 1.0)) > math.log10(MAX_MAGNITUDE):
        raise CalculatorError("result too large")
    result = base**exponent
    if isinstance(result, complex):
        raise CalculatorError("result is not a real number")
    return _checked(result)


def _call(node: ast.Call) -> Number:
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
        raise CalculatorError(f"unknown function; available: {', '.join(FUNCTIONS)}")
    if node.keywords:
        raise CalculatorError("keyword arguments are not supported")
    args = [_eval(arg) for arg in node.args]
    try:
        result = FUNCTIONS[node.func.id](*args)
    except (TypeError, ValueError) as exc:
        raise CalculatorError(f"{node.func.id}: {exc}") from None
    return _checked(Fraction(result) if isinstance(result, int) else result)


def _checked(value: Any) -> Number:
    if not isinstance(value, Fraction | float | int):
        raise CalculatorError(f"unexpected result {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    if abs(float(value)) > MAX_MAGNITUDE:
        raise CalculatorError("result too large")
    return Fraction(value) if isinstance(value, int) else value


class CalculatorConfig(RollModel):
    type: Literal["calculator"] = Field(
        "calculator", description="selects this tool (its roll.tool entry point)"
    )
    name: str = Field(default="calculator", description="the function name the model calls")


class CalculatorTool:
    """The :class:`~roll.agentic.types.Tool` over :func:`evaluate`."""

    description = "Evaluate an arithmetic expression (+ - * / // % ** parentheses, abs sqrt round min max)."
    parameters: dict[str, Any] = {  # noqa: RUF012 - read-only JSON schema shared by instances
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. (3 + 5) * 2"}},
        "required": ["expression"],
    }

    def __init__(self, config: CalculatorConfig | None = None) -> None:
        self.name = (config or CalculatorConfig()).name

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            return ToolResult("error: missing string argument 'expression'", ok=False)
        try:
            return ToolResult(format_number(evaluate(expression)))
        except CalculatorError as exc:
            return ToolResult(f"error: {exc}", ok=False)

    def close(self) -> None:
        return None
