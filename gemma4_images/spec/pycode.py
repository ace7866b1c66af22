"""Whether two versions of a Python module run the same code: their syntax trees compared with
docstrings left out. vllm-tpu 0.30.0's copies of the files the fixes touch differ from vLLM
0.30.0's only in docstrings and blank lines (a docstring-lint pass on vLLM's main branch); when
the trees agree, a fix's behaviour tests on vLLM 0.30.0 speak for the other copy too."""

from __future__ import annotations

import ast


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def code(source: bytes) -> str:
    """The module's syntax tree without docstrings, as text (no line numbers)."""
    return ast.dump(_without_docstrings(ast.parse(source)))


def same_code(a: bytes, b: bytes) -> bool:
    return code(a) == code(b)
