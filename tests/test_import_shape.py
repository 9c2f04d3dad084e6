"""The shape of the code, measured: no import circles, layers that only import downwards, private paths kept private.

Every import counts: top-level, inside functions and under ``if TYPE_CHECKING:``
(a type-only import is still a dependency a reader must follow), and a name
imported through a package's ``__init__`` counts as an import of the module
that defines it.  ``docs/design.md`` ("Layers") explains the order.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGES = ("dispatchcore", "executors_local", "executors_ray", "executors_torchrun")

#: The core's layers, lowest first: a module may import its own layer and the ones before it only.
LAYERS = (
    "_base",
    "_wire",
    "_data",
    "_trace",
    "_transfer",
    "_spi",
    "_rows",
    "_dispatch",
    "_worker",
    "_runtime",
    "_lane",  # its links import nothing; its driver and rank sides run calls through _runtime's WorkerHost
    "_bridge",  # tensors rank to rank between processes: pair groups met on a store, requests on lane links
    "_group",
    "_sync",
    "_async",  # async RL: a rollout stream over groups and WeightSync
)


def _modules() -> dict[str, Path]:
    out = {}
    for f in SRC.rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        if parts[0] not in PACKAGES:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def _statements(name: str, path: Path) -> Iterator[tuple[str, str | None]]:
    """``(module, imported name)`` for every import in module ``name``, relative ones made absolute.

    ``import a.b`` gives ``("a.b", None)``; ``from .x import y`` gives ``("<package>.x", "y")``.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield from ((base, alias.name) for alias in node.names)


def _raw_imports(name: str, path: Path) -> Iterator[str]:
    """Every module ``name`` imports (absolute dotted names), wherever the import statement is."""
    for module, imported in _statements(name, path):
        if imported is None:
            yield module
        else:
            sub = f"{module}.{imported}"
            yield sub if sub in MODULES else _through_face(module, imported)


def _written_imports(name: str, path: Path) -> Iterator[str]:
    """The paths ``name``'s import statements spell out (a public face is public whoever defines the name)."""
    for module, imported in _statements(name, path):
        yield f"{module}.{imported}" if imported is not None and imported.startswith("_") else module


def _through_face(module: str, name: str) -> str:
    """The module that defines ``name`` when it is imported through a package face (a door, not a room)."""
    path = MODULES.get(module)
    if path is None or path.name != "__init__.py":
        return module
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level and any((a.asname or a.name) == name for a in node.names):
            target = ".".join([module, node.module] if node.module else [module])
            return _through_face(target, name) if target != module else module
    return module


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        top = name.split(".")[0]
        deps = {d for d in _raw_imports(name, path) if d in MODULES and d != name and d.split(".")[0] == top}
        if path.name == "__init__.py":  # a face handing on its own package's names is no dependency
            deps = {d for d in deps if not d.startswith(name + ".")}
        graph[name] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert _circles(_graph()) == []


#: The longest import chain inside ``dispatchcore`` (faces, demo and testing kit included), in modules.
MAX_DEPTH = 12


def _depths(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module's longest import chain (itself first), in a graph without circles."""
    memo: dict[str, list[str]] = {}

    def chain(m: str) -> list[str]:
        if m not in memo:
            below = [chain(d) for d in graph[m]]
            memo[m] = [m, *max(below, key=len, default=[])]
        return memo[m]

    return {m: chain(m) for m in graph}


def test_the_core_is_at_most_twelve_imports_deep() -> None:
    graph = _graph()
    assert _circles(graph) == []
    core = {m: deps for m, deps in graph.items() if m.split(".")[0] == "dispatchcore"}
    longest = max(_depths(core).values(), key=len)
    assert len(longest) <= MAX_DEPTH, " -> ".join(longest)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_core_layers_import_only_downwards() -> None:
    upward = []
    for name, deps in _graph().items():
        own = _layer(name)
        if own is None:
            continue
        upward += [
            f"{name} -> {d}"
            for d in sorted(deps)
            if (_layer(d) is None and d.startswith("dispatchcore"))
            or (
                _layer(d) is not None and _layer(d) > own  # type: ignore[operator]
            )
        ]
    assert upward == []


def test_core_folder_holds_faces_and_concept_packages_only() -> None:
    entries = sorted(p.name for p in (SRC / "dispatchcore").iterdir() if p.name != "__pycache__")
    packages = [e for e in entries if (SRC / "dispatchcore" / e).is_dir()]
    modules = [e for e in entries if e.endswith(".py")]
    assert set(packages) == {*LAYERS, "_cli", "demo", "testing", "executor", "wire", "collective"}
    assert set(modules) == {"__init__.py"}


@pytest.mark.parametrize("face", ["dispatchcore.executor", "dispatchcore.wire", "dispatchcore.collective"])
def test_the_executor_faces_hold_no_code(face: str) -> None:
    """A face is a door, not a room: only imports and ``__all__``, so its names are defined in one place."""
    tree = ast.parse(MODULES[face].read_text())
    kinds = {type(node).__name__ for node in tree.body}
    assert kinds <= {"Expr", "ImportFrom", "Assign"}, kinds
    assigned = [
        t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    ]
    assert assigned == ["__all__"]


@pytest.mark.parametrize("package", ["executors_local", "executors_ray", "executors_torchrun", "dispatchcore.testing"])
def test_executors_and_the_testing_kit_use_public_core_names_only(package: str) -> None:
    reaches = []
    for name, path in MODULES.items():
        if name != package and not name.startswith(package + "."):
            continue
        for dep in _written_imports(name, path):
            parts = dep.split(".")
            if parts[0] == "dispatchcore" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:]):
                reaches.append(f"{name} -> {dep}")
    assert reaches == []
