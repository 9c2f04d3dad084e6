"""The README's tested snippets run as written: each ``python`` block after a ``<!-- tested: ... -->`` line.

A snippet that drifts from the API fails here, not in a newcomer's first
hour.  Each block runs in a fresh namespace, on the ``local`` backend (and
the ``faulty`` one over it) unless it says otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
#: A marker line, then a fenced python block.
_TESTED = re.compile(r"<!-- tested: [^>]*-->\n```python\n(.*?)\n```", re.DOTALL)


def readme_snippets() -> list[str]:
    return _TESTED.findall(README.read_text())


def test_the_readme_has_readme_snippets() -> None:
    assert any("create_colocated_worker_cls" in s and "spawn" in s for s in readme_snippets())


@pytest.mark.parametrize("index", range(len(readme_snippets())))
def test_a_readme_snippet_runs(index: int) -> None:
    code = compile(readme_snippets()[index], f"README.md (tested snippet {index})", "exec")
    exec(code, {"__name__": f"readme_snippet_{index}"})  # noqa: S102 - the project's own README
