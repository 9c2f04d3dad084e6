#!/usr/bin/env python
"""Static scan: every single-controller and protocol name verl's own trainer code uses, and whether we have it.

Run by ``scripts/verl_parity.py --scan`` (or on its own:
``python scripts/verl_scan.py --verl-src DIR``, ``DIR`` holding verl 0.9.1's
``verl/`` package, e.g. its unpacked wheel; never committed).  It parses
``verl/trainer``, ``verl/workers`` and ``verl/experimental`` (no verl import)
and lists:

* **names**: everything imported from ``verl.single_controller*``,
  ``verl.protocol`` and ``verl`` (``DataProto``), looked up at the ported path
  (``scripts/verl_parity.py``'s ``IMPORT_MAP``);
* **attributes**: ``Name.attr`` on those names (``Dispatch.ONE_TO_ALL``,
  ``DataProto.concat``); the verl-defined members read on worker groups,
  resource pools and pool managers (receivers named like ``*_wg``,
  ``worker_group``, ``*resource_pool*``, ``*_manager``, ``training_client``);
  verl's ``Worker`` members read on ``self`` in classes deriving from it; and
  verl's ``DataProto`` members read on receivers named like data
  (``batch``, ``data``, ``*_output``, ...).  Only members verl's own classes
  define count, so a worker's registered methods (``wg.update_actor``) do not.

Each call site (``Name(...)``, ``wg.spawn(prefix_set=...)``) is bound
against our signature with its positional count and keyword names; a name is
covered when it exists at the ported path and every call site binds.  The
last line is ``covered K/N names``; an exclusion (``EXCLUDED`` below, each
with its reason) is listed and counted in N, never as covered.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCANNED = ("verl/trainer", "verl/workers", "verl/experimental")
#: verl module (exact or prefix + ".") -> ours; the longest match wins.
PORTED = {
    "verl": "dispatchcore",
    "verl.protocol": "dispatchcore",
    "verl.single_controller": "dispatchcore",
    "verl.single_controller.base": "dispatchcore",
    "verl.single_controller.ray": "executors_ray",
}
#: verl classes whose members count as surface, by the receiver kinds that read them.
VERL_CLASSES = {
    "group": (
        "verl/single_controller/ray/base.py:RayWorkerGroup",
        "verl/single_controller/base/worker_group.py:WorkerGroup",
    ),
    "pool": (
        "verl/single_controller/ray/base.py:RayResourcePool",
        "verl/single_controller/ray/base.py:SubRayResourcePool",
        "verl/single_controller/base/worker_group.py:ResourcePool",
    ),
    "manager": ("verl/single_controller/ray/base.py:ResourcePoolManager",),
    "worker": ("verl/single_controller/base/worker.py:Worker",),
    "data": ("verl/protocol.py:DataProto",),
    "future": ("verl/protocol.py:DataProtoFuture",),
    "spec": (
        "verl/single_controller/ray/base.py:RayClassWithInitArgs",
        "verl/single_controller/base/worker_group.py:ClassWithInitArgs",
    ),
}
#: Which of our classes answers for each kind.
OURS = {
    "group": ("executors_ray", "RayWorkerGroup"),
    "pool": ("executors_ray", "SubRayResourcePool"),
    "manager": ("executors_ray", "ResourcePoolManager"),
    "worker": ("dispatchcore", "Worker"),
    "data": ("dispatchcore", "DataProto"),
    "future": ("dispatchcore", "DataProtoFuture"),
    "spec": ("executors_ray", "RayClassWithInitArgs"),
}
RECEIVERS = {
    "group": re.compile(r"(^|_)(wg|worker_group|training_client|wg_dict|rollout_wg)$"),
    "pool": re.compile(r"resource_pool$|(^|_)pool$"),
    "manager": re.compile(r"(^|_)manager$"),
    "data": re.compile(r"(^|_)(batch|data|output|outputs|proto|dataproto)$"),
    "future": re.compile(r"(^|_)(future|futures|fut)$"),
    "spec": re.compile(r"(^|_)(cls|cls_with_init|cls_with_init_args)$"),
}
#: Names we knowingly do not provide, each with its reason (counted in N, never covered).
EXCLUDED: dict[str, str] = {}


@dataclass
class Use:
    """One name or attribute: where verl uses it and how it is called."""

    key: str
    kind: str  # "name" or the receiver kind of an attribute
    module: str = ""
    count: int = 0
    calls: list[tuple[int, tuple[str, ...], bool]] = field(default_factory=list)  # (n positional, keywords, splat)
    where: str = ""


def ported(module: str) -> str | None:
    """Our module for verl's ``module`` (``verl`` itself only exactly: ``verl.utils`` is not ported)."""
    best = max(
        (m for m in PORTED if module == m or (m != "verl" and module.startswith(m + "."))), key=len, default=None
    )
    return None if best is None else PORTED[best]


def verl_members(src: Path, kind: str) -> set[str]:
    """Members verl's classes of ``kind`` define: methods, class attributes, ``self.x =`` and dataclass fields."""
    found: set[str] = set()
    for spec in VERL_CLASSES[kind]:
        path, cls_name = spec.split(":")
        tree = ast.parse((src / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls_name:
                found |= _class_members(node)
    if kind == "group":  # verl binds its Worker's registered methods on every group
        found |= registered_methods(src / "verl/single_controller/base/worker.py", "Worker")
    return {m for m in found if not m.startswith("__")}


def registered_methods(path: Path, cls_name: str) -> set[str]:
    """Methods of ``cls_name`` in ``path`` decorated with ``@register(...)``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            return {
                item.name
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and any(
                    receiver_name(d.func if isinstance(d, ast.Call) else d) == "register" for d in item.decorator_list
                )
            }
    return set()


def _class_members(node: ast.ClassDef) -> set[str]:
    found: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            found.add(item.target.id)
        elif isinstance(item, ast.Assign):
            found |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Assign, ast.AnnAssign)):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    found.add(t.attr)
    return found


def receiver_name(node: ast.expr) -> str:
    """``wg`` of ``wg.x``, ``actor_wg`` of ``self.actor_wg.x``, else ``""``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


class FileScan(ast.NodeVisitor):
    """Collects the uses in one file."""

    def __init__(self, uses: dict[str, Use], members: dict[str, set[str]], worker_classes: set[str], path: str):
        self.uses, self.members, self.worker_classes, self.path = uses, members, worker_classes, path
        self.imported: dict[str, tuple[str, str]] = {}  # local alias -> (verl module, name)
        self.in_worker = 0
        self.calls: dict[int, ast.Call] = {}

    def note(self, key: str, kind: str, module: str, node: ast.AST) -> None:
        use = self.uses.setdefault(key, Use(key, kind, module, where=f"{self.path}:{getattr(node, 'lineno', 0)}"))
        use.count += 1
        call = self.calls.get(id(node))
        if call is not None:
            splat = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
            positional = sum(not isinstance(a, ast.Starred) for a in call.args)
            use.calls.append((positional, tuple(k.arg for k in call.keywords if k.arg), splat))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if ported(module) and (module != "verl" or any(a.name == "DataProto" for a in node.names)):
            for alias in node.names:
                if module == "verl" and alias.name != "DataProto":
                    continue
                self.imported[alias.asname or alias.name] = (module, alias.name)
                self.note(alias.name, "name", module, node)

    def visit_Call(self, node: ast.Call) -> None:
        self.calls[id(node.func)] = node
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        derives = node.name in self.worker_classes
        self.in_worker += derives
        self.generic_visit(node)
        self.in_worker -= derives

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.imported:
            name = self.imported[node.id][1]
            self.uses[name].count += 1
            if id(node) in self.calls:
                self.uses[name].calls.extend(self._call_of(node))

    def visit_Assign(self, node: ast.Assign) -> None:
        """``wg_kwargs["x"] = ...``: keywords verl's trainer splats into ``RayWorkerGroup(**wg_kwargs)``."""
        for target in node.targets:
            if (
                isinstance(target, ast.Subscript)
                and receiver_name(target.value).endswith("wg_kwargs")
                and isinstance(target.slice, ast.Constant)
                and isinstance(target.slice.value, str)
            ):
                use = self.uses.setdefault(
                    "RayWorkerGroup", Use("RayWorkerGroup", "name", "verl.single_controller.ray")
                )
                use.calls.append((0, (target.slice.value,), True))
        self.generic_visit(node)

    def _call_of(self, node: ast.AST) -> list[tuple[int, tuple[str, ...], bool]]:
        call = self.calls[id(node)]
        splat = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
        return [
            (
                sum(not isinstance(a, ast.Starred) for a in call.args),
                tuple(k.arg for k in call.keywords if k.arg),
                splat,
            )
        ]

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = node.value
        if isinstance(base, ast.Name) and base.id in self.imported:
            module, name = self.imported[base.id]
            self.note(f"{name}.{node.attr}", "class", module, node)
        elif isinstance(base, ast.Name) and base.id == "self" and self.in_worker:
            if node.attr in self.members["worker"]:
                self.note(f"Worker.{node.attr}", "worker", "", node)
        else:
            who = receiver_name(base)
            for kind, pattern in RECEIVERS.items():
                if who and pattern.search(who) and node.attr in self.members[kind]:
                    self.note(f"{OURS[kind][1] if kind != 'pool' else 'RayResourcePool'}.{node.attr}", kind, "", node)
                    break
        self.generic_visit(node)


def worker_classes(files: list[tuple[str, ast.Module]]) -> set[str]:
    """Names of classes deriving (by name, transitively) from verl's ``Worker``."""
    bases: dict[str, set[str]] = {}
    for _, tree in files:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(receiver_name(b) for b in node.bases)
    found = {"Worker"}
    while True:
        more = {name for name, bs in bases.items() if bs & found} - found
        if not more:
            return found - {"Worker"}
        found |= more


def scan(src: Path) -> tuple[dict[str, Use], int]:
    files = [
        (str(p.relative_to(src)), ast.parse(p.read_text(), filename=str(p)))
        for d in SCANNED
        for p in sorted((src / d).rglob("*.py"))
    ]
    members = {kind: verl_members(src, kind) for kind in VERL_CLASSES}
    workers = worker_classes(files)
    uses: dict[str, Use] = {}
    for path, tree in files:
        FileScan(uses, members, workers, path).visit(tree)
    return uses, len(files)


# -- checking against ours --------------------------------------------------------------
def our_object(use: Use) -> tuple[Any, str]:
    """Our object for ``use`` (or ``None``) and where we looked."""
    if use.kind == "name":
        target = ported(use.module) or ""
        return getattr(importlib.import_module(target), use.key, None), f"{target}.{use.key}"
    owner, attr = use.key.split(".", 1)
    if use.kind == "class":
        target = ported(use.module) or ""
        cls = getattr(importlib.import_module(target), owner, None)
    else:
        target, name = OURS[use.kind]
        cls = getattr(importlib.import_module(target), name, None)
        if cls is None and use.kind == "pool":
            cls = getattr(importlib.import_module(target), "RayResourcePool", None)
    where = f"{target}.{owner}.{attr}"
    if cls is None:
        return None, where
    return member(cls, attr), where


_MISSING = object()


class Unbound:
    """A method looked up on its class: its first parameter (``self``) is not the caller's."""

    def __init__(self, func: Any) -> None:
        self.func = func


def member(cls: Any, attr: str) -> Any:
    """``cls.attr``, or a marker for an instance attribute our class sets (``self.attr =``, dataclass field)."""
    if hasattr(cls, attr):
        raw = inspect.getattr_static(cls, attr, None)
        value = getattr(cls, attr)
        plain_method = inspect.isfunction(raw)
        return Unbound(value) if plain_method else value
    if dataclasses.is_dataclass(cls) and attr in {f.name for f in dataclasses.fields(cls)}:
        return "instance attribute"
    for klass in getattr(cls, "__mro__", ()):
        try:
            tree = ast.parse(inspect.getsource(klass).lstrip() if klass.__module__ != "builtins" else "")
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and attr in _class_members(node):
                return "instance attribute"
    return None


def binds(obj: Any, calls: list[tuple[int, tuple[str, ...], bool]], is_method: bool) -> str:
    """``""`` when every call site binds to ``obj``'s signature, else why not."""
    skip = 1 if isinstance(obj, Unbound) else 0
    obj = obj.func if isinstance(obj, Unbound) else obj
    if not calls or not callable(obj):
        return ""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    params = list(sig.parameters.values())[skip:]
    sig = sig.replace(parameters=params)
    named = {p.name for p in params if p.kind is not p.VAR_KEYWORD}
    accepted = getattr(obj, "ACCEPTED_KEYWORDS", None)  # a **options signature that says what it takes
    for positional, keywords, splat in calls:
        args = [object()] * positional
        kwargs = dict.fromkeys(keywords, object())
        try:
            (sig.bind_partial if splat else sig.bind)(*args, **kwargs)
        except TypeError as exc:
            return f"call with {positional} positional + {list(keywords)}: {exc}"
        unknown = set(keywords) - named - set(accepted or ())
        if accepted is not None and unknown:
            return f"keyword(s) {sorted(unknown)} are not among those it takes"
    return ""


def report(uses: dict[str, Use], n_files: int) -> int:
    covered = 0
    rows = []
    for key in sorted(uses, key=lambda k: (uses[k].kind != "name", k)):
        use = uses[key]
        if key in EXCLUDED:
            rows.append((key, use.count, "excluded", EXCLUDED[key]))
            continue
        try:
            obj, where = our_object(use)
        except ImportError as exc:
            obj, where = None, f"import failed: {exc}"
        if obj is None:
            rows.append((key, use.count, "MISSING", f"{where} (first use {use.where})"))
            continue
        why = binds(obj, use.calls, is_method=use.kind != "name")
        if why:
            rows.append((key, use.count, "SIGNATURE", f"{where}: {why}"))
            continue
        covered += 1
        rows.append((key, use.count, "ok", where))
    width = max(len(r[0]) for r in rows) if rows else 10
    print(f"verl scan: {n_files} files under {', '.join(SCANNED)}; {len(rows)} names and attributes")
    for key, count, status, detail in rows:
        print(f"  {key:<{width}}  {count:>4}  {status:<9}  {detail}")
    print(f"covered {covered}/{len(rows)} names")
    return 0 if covered == len(rows) else 1


def iter_sources(src: Path) -> Iterator[Path]:
    for d in SCANNED:
        yield from (src / d).rglob("*.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl-src", type=Path, required=True, help="directory holding verl's 'verl/' package")
    parser.add_argument(
        "--src",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "src",
        help="our packages (default: this checkout's)",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.src))
    if not (args.verl_src / "verl" / "trainer").is_dir():
        print(f"{args.verl_src} holds no verl/trainer; unpack verl's wheel there", file=sys.stderr)
        return 2
    uses, n = scan(args.verl_src)
    return report(uses, n)


if __name__ == "__main__":
    sys.exit(main())
