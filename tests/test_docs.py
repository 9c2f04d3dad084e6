"""The docs cannot drift: README.md and docs/*.md are checked as code.

Every ``python`` block is marked on the line before its fence, either
``<!-- tested: <what it shows> -->`` (it runs here as written, in a fresh
namespace) or ``<!-- not run: <why> -->``; an unmarked block fails.  Relative
links and backticked repository paths (``src/...py``, ``tests/...py``,
``_group/_stuck.py``) must name files that exist, and a link's ``#anchor`` a
heading of its page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from dispatchcore import Dispatch, unregister_dispatch_mode
from dispatchcore._cli._bench import TABLES_MARKER, write_tables

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```(\w*)")
_MARK = re.compile(r"^<!-- (tested|not run): \S[^>]*-->$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)+/?)`")
_SUFFIXES = (".py", ".md", ".toml", ".txt", ".sh", ".json", ".cfg", ".ini", ".yaml", ".yml")
#: Paths in other projects' repositories (cited, not checked).
_OTHER_PROJECTS = ("ray/", "torch/", "verl/", "vllm/", "transformers/")
#: Where a backticked path may be rooted: the repository, ``src/`` (``executors_ray/...``), the core's package.
_PATH_ROOTS = (ROOT, ROOT / "src", ROOT / "src" / "dispatchcore")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    mark: str | None  # "tested", "not run", or None
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the marker on the line before its fence."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        mark = _MARK.match(lines[i - 1]) if i else None
        code = "\n".join(lines[i + 1 : end])
        found.append(Block(page, i + 1, fence.group(1), mark.group(1) if mark else None, code))
        i = end + 1
    return found


def prose(page: Path) -> str:
    """The page without its fenced blocks (paths inside code are examples, not references)."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


def runnable_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.language == "python" and b.mark == "tested"]


def test_every_python_block_is_tested_or_says_why_not() -> None:
    unmarked = [b.where for page in PAGES for b in blocks(page) if b.language == "python" and b.mark is None]
    assert not unmarked, (
        "put <!-- tested: what it shows --> (the block then runs in tests/test_docs.py) or "
        f"<!-- not run: why --> on the line before each python fence: {unmarked}"
    )


def test_the_docs_run_a_driver_and_colocated_roles() -> None:
    assert any("WorkerGroup(" in b.code for b in runnable_blocks() if b.page.name == "README.md")
    assert any("create_colocated_worker_cls" in b.code and "spawn" in b.code for b in runnable_blocks())


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.where)
def test_a_tested_block_runs(block: Block) -> None:
    modes_before = {mode.name for mode in Dispatch}
    try:
        code = compile(block.code, block.where, "exec")
        exec(code, {"__name__": "docs_block"})  # noqa: S102 - the project's own docs
    finally:
        for name in {mode.name for mode in Dispatch} - modes_before:  # a block registering a mode leaves none behind
            unregister_dispatch_mode(name)


def _headings(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings."""
    titles = re.findall(r"^#+ (.+)$", prose(page), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", t.strip().lower()).replace(" ", "-") for t in titles}


def _missing(target: Path) -> bool:
    return not target.exists()


def broken_links(page: Path) -> list[str]:
    """The page's relative links whose file, or whose ``#anchor`` heading, does not exist."""
    broken = []
    for link in _LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if _missing(target):
            broken.append(link)
        elif anchor and target.suffix == ".md" and target.exists() and anchor not in _headings(target):
            broken.append(f"{link} (no such heading)")
    return broken


def missing_paths(page: Path) -> list[str]:
    """Backticked repository paths in the page's prose that name no file or folder."""
    paths = [
        p
        for p in _PATH.findall(prose(page))
        if (p.endswith("/") or p.endswith(_SUFFIXES)) and not p.startswith(_OTHER_PROJECTS)
    ]
    return [
        p for p in paths if all(_missing(base / p) for base in _PATH_ROOTS) and _missing((page.parent / p).resolve())
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_name_files_and_headings_that_exist(page: Path) -> None:
    assert broken_links(page) == [], f"{page.relative_to(ROOT)} links to what does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_backticked_repository_paths_exist(page: Path) -> None:
    assert missing_paths(page) == [], f"{page.relative_to(ROOT)} names files that do not exist"


def test_the_checks_catch_an_unmarked_block_a_dead_link_and_a_missing_path(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n[ok](page.md#title) [gone](nowhere.md) [bad anchor](page.md#nope) `src/dispatchcore/nope.py` "
        "`src/dispatchcore/__init__.py` `tests/`\n\n```python\nx = 1\n```\n\n<!-- not run: why -->\n"
        "```python\n`src/in_code.py`\n```\n"
    )
    assert [(b.line, b.mark) for b in blocks(page)] == [(5, None), (10, "not run")]
    assert broken_links(page) == ["nowhere.md", "page.md#nope (no such heading)"]
    assert missing_paths(page) == ["src/dispatchcore/nope.py"]


def test_the_readme_links_every_docs_page_and_design_lists_them() -> None:
    readme, design = (ROOT / "README.md").read_text(), (ROOT / "docs" / "design.md").read_text()
    assert len(readme.splitlines()) <= 300, "the README is read in ten minutes: move detail to a docs/ page"
    pages = [p.name for p in PAGES[1:]]
    assert [p for p in pages if f"(docs/{p})" not in readme] == []
    assert [p for p in pages if p != "design.md" and p not in design] == []


def test_design_lists_every_layer_of_the_core() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    layers = [p.name for p in (ROOT / "src" / "dispatchcore").iterdir() if p.name.startswith("_") and p.is_dir()]
    assert [name for name in layers if name not in ("_cli", "__pycache__") and f"| `{name}` |" not in design] == []


def test_bench_out_rewrites_only_the_tables_of_the_page_dated_with_the_machine(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nprose kept\n\n{TABLES_MARKER}\n## Tables\n\nold numbers\n")
    write_tables(page, "\n### local\n\n| N | ms |\n", "dispatchcore bench --quick")
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nprose kept\n") and "old numbers" not in text
    assert "with `dispatchcore bench --quick` on " in text and "CPU cores" in text and "torch " in text
    assert text.endswith("| N | ms |\n") and text.count(TABLES_MARKER) == 1
    assert (ROOT / "docs" / "benchmarks.md").read_text().count(TABLES_MARKER) == 1
