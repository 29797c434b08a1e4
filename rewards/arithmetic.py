"""Evaluate a model-written arithmetic expression safely: integers, + - * /, parentheses, nothing else.

TinyZero scores Countdown with `eval()` behind a character filter. That still lets `9**9**9` (via `**`) freeze a
worker, and any bug in the filter would run model text. Here the text goes through four bounds before any
arithmetic: length, an ASCII character whitelist, Python's parser (which builds a syntax tree and executes nothing)
and a walker that accepts only integer literals, unary +/-, the four binary operators and a nesting depth limit.
Values are exact `Fraction`s (so `(1 / 3) * 3 == 1`) with a magnitude cap, so nothing can grow without bound.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

MAX_CHARS = 200
"""Longest expression considered; a 3-6 number Countdown answer needs well under 100 characters."""
MAX_DEPTH = 32
"""Deepest syntax tree walked (parentheses and unary signs both count)."""
MAX_MAGNITUDE = 10**18
"""Largest numerator or denominator allowed in any intermediate value."""

# ASCII digits only: `\d` would also admit other scripts' digits, which int() accepts but the puzzle does not.
_ALLOWED = re.compile(r"[0-9+\-*/() \t\r\n]*")
_BINARY = (ast.Add, ast.Sub, ast.Mult, ast.Div)


class ExpressionError(ValueError):
    """The text is not a bounded integer arithmetic expression (or divides by zero)."""


def parse(text: str) -> ast.expr:
    """Syntax tree of `text` after the length, character and grammar checks; raises ExpressionError."""
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"expression longer than {MAX_CHARS} characters")
    if not _ALLOWED.fullmatch(text):
        raise ExpressionError("only digits, + - * / ( ) and spaces are allowed")
    # Newlines would end the statement for the parser; they carry no meaning in an equation.
    flat = " ".join(text.split())
    try:
        return ast.parse(flat, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ExpressionError(f"not an expression: {exc.__class__.__name__}") from None


def literals(node: ast.expr) -> list[int]:
    """Integer literals in the tree, in order (assumes a tree from `parse`)."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and type(n.value) is int]


def evaluate(node: ast.expr, depth: int = 0) -> Fraction:
    """Exact value of a tree from `parse`; raises ExpressionError for anything but integer + - * / arithmetic."""
    if depth > MAX_DEPTH:
        raise ExpressionError(f"nested deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Constant) and type(node.value) is int:
        value = Fraction(node.value)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        inner = evaluate(node.operand, depth + 1)
        value = -inner if isinstance(node.op, ast.USub) else inner
    elif isinstance(node, ast.BinOp) and isinstance(node.op, _BINARY):
        left, right = evaluate(node.left, depth + 1), evaluate(node.right, depth + 1)
        value = _apply(node.op, left, right)
    else:
        raise ExpressionError(f"{node.__class__.__name__} is not allowed")
    if abs(value.numerator) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE:
        raise ExpressionError(f"intermediate value exceeds {MAX_MAGNITUDE:.0e}")
    return value


def _apply(op: ast.operator, left: Fraction, right: Fraction) -> Fraction:
    if isinstance(op, ast.Add):
        return left + right
    if isinstance(op, ast.Sub):
        return left - right
    if isinstance(op, ast.Mult):
        return left * right
    if right == 0:
        raise ExpressionError("division by zero")
    return left / right
