"""Python source to an AST, one thread at a time.

CPython 3.11 keeps the AST constructor's recursion depth in state the interpreter shares between threads, so two
threads building ASTs at once can spoil each other's count, and one of them fails with ``SystemError: AST
constructor recursion depth mismatch`` (python/cpython#106905). farmd parses in worker threads, several at once
(packages' scans and mutants, arithmetic answers), so every parse of farmd's goes through ``parse``: seen on
4 December, when four submissions' tier-1 scans ran together.
"""

from __future__ import annotations

import ast
import threading

_ONE_AT_A_TIME = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` of a module, never beside another thread's parse."""
    with _ONE_AT_A_TIME:
        return ast.parse(source, filename=filename)


def parse_expression(source: str) -> ast.Expression:
    """``ast.parse`` of one expression (``mode="eval"``), never beside another thread's parse."""
    with _ONE_AT_A_TIME:
        return ast.parse(source, mode="eval")
