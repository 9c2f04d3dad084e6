"""Static check for test code that the newest pytest deprecates or rejects.

The installed pytest only warns about what it knows; a suite that passes on
an older pytest can fail on a fresh clone.  This reads the source instead,
so it fails the same way whatever pytest is installed.  It covers our tests,
the conformance suite third-party executor authors subclass, and examples.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = [ROOT / "tests", ROOT / "src" / "dispatchcore" / "testing", ROOT / "examples"]
WIDE_SCOPES = {"class", "module", "package", "session"}
ONE_SHOT_ITERABLES = {"map", "filter", "zip", "iter", "reversed", "enumerate"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return ""


def _fixture_scope(decorator: ast.expr) -> str | None:
    """The scope of a ``@pytest.fixture(...)`` decorator, or None if it is not one."""
    if _dotted(decorator) not in {"pytest.fixture", "fixture"}:
        return None
    if isinstance(decorator, ast.Call):
        for kw in decorator.keywords:
            if kw.arg == "scope" and isinstance(kw.value, ast.Constant):
                return str(kw.value.value)
    return "function"


def problems_in(source: str, where: str) -> list[str]:
    """Deprecated or rejected pytest patterns in one file's source."""
    found: list[str] = []
    tree = ast.parse(source)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            names = {_dotted(d) for d in fn.decorator_list}
            for d in fn.decorator_list:
                scope = _fixture_scope(d)
                if scope in WIDE_SCOPES and not names & {"classmethod", "staticmethod"}:
                    found.append(
                        f"{where}:{fn.lineno}: {scope}-scoped fixture {cls.name}.{fn.name} is an instance method "
                        "(pytest 9.1+ deprecates it): add @classmethod below @pytest.fixture"
                    )
    for node in ast.walk(tree):
        name = _dotted(node) if isinstance(node, (ast.Attribute, ast.Call)) else ""
        if isinstance(node, ast.Attribute) and name.endswith("pytest.yield_fixture"):
            found.append(f"{where}:{node.lineno}: pytest.yield_fixture is deprecated; use pytest.fixture")
        if isinstance(node, ast.Attribute) and node.attr == "inicfg":
            found.append(f"{where}:{node.lineno}: config.inicfg is deprecated; use config.getini()")
        if isinstance(node, ast.Attribute) and name.endswith("pytest.console_main"):
            found.append(f"{where}:{node.lineno}: pytest.console_main() is deprecated; use pytest.main()")
        if isinstance(node, ast.Call) and name.endswith("mark.parametrize") and len(node.args) >= 2:
            values = node.args[1]
            one_shot = isinstance(values, ast.GeneratorExp) or (
                isinstance(values, ast.Call) and _dotted(values.func) in ONE_SHOT_ITERABLES
            )
            if one_shot:
                found.append(f"{where}:{node.lineno}: parametrize with a one-shot iterable is deprecated; pass a list")
    return found


def test_no_deprecated_pytest_patterns() -> None:
    files = [f for d in CHECKED if d.exists() for f in sorted(d.rglob("*.py"))]
    assert files, "nothing to check: the checked folders moved"
    found = [p for f in files for p in problems_in(f.read_text(), str(f.relative_to(ROOT)))]
    assert not found, "\n".join(found)


def test_checker_finds_each_pattern() -> None:
    bad = """
import pytest

class Suite:
    @pytest.fixture(scope="class")
    def group(self):
        yield 1

    @pytest.fixture(scope="module")
    @classmethod
    def fine(cls):
        yield 2

    @pytest.fixture
    def per_test(self):
        return 3

@pytest.yield_fixture
def old():
    yield

@pytest.mark.parametrize("x", (i for i in range(3)))
def test_gen(x):
    pass

@pytest.mark.parametrize("x", map(str, [1]))
def test_map(x):
    pass

def hook(config):
    return config.inicfg, pytest.console_main
"""
    found = problems_in(bad, "bad.py")
    assert len(found) == 6, found
    assert "Suite.group" in found[0]
    assert not any("fine" in p or "per_test" in p for p in found)
