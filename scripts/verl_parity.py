#!/usr/bin/env python
"""Run verl 0.9.1's own CPU tests against verl and against dispatchcore, side by side.

The pitch to verl users is "port your driver by changing imports".  This
harness holds us to it with verl's tests: it downloads verl 0.9.1's sdist
from the package registry (never committed), takes ``tests/test_protocol_on_cpu.py``
and the single-controller tests that need no GPU (``tests/single_controller/*_cpu.py``),
and runs them twice in one virtual environment that has verl installed:

* **verl**: the files as shipped;
* **dispatchcore**: the same files with their imports rewritten (``IMPORT_MAP``
  below) to ``dispatchcore`` / ``executors_ray``, which are installed for that
  run only (``pip install --target``, put first on ``PYTHONPATH``).

Import map (the only change made to verl's test files):

====================================================  =========================
verl module                                           dispatchcore module
====================================================  =========================
``verl`` (``from verl import DataProto``)              ``dispatchcore``
``verl.protocol``                                      ``dispatchcore``
``verl.single_controller.base`` and its submodules     ``dispatchcore``
(``decorator``, ``worker``, ``worker_group``)
``verl.single_controller.ray`` and ``...ray.base``     ``executors_ray``
``verl.utils.*`` (test helpers: ``tensordict_utils``,   kept: verl's own helpers
``device``, ``ray_utils``)
====================================================  =========================

Finer rules, applied per imported name: a name the target does not export is
imported from verl instead when it is one of verl's internal helpers
(``VERL_INTERNAL_NAMES``: its serializers and Ray utilities), and is bound to
a stub that fails when used otherwise, so only the tests that use a missing
name fail (and say which name).  A test is reported apart, as a test of
verl-internal helpers, when it uses such a helper or its file imports nothing
of verl's public surface.

Ray: the tests call ``ray.init`` themselves; a ``conftest.py`` added to both
copies makes every such call start a fresh local Ray (``address="local"``:
never one found through ``RAY_ADDRESS`` or ``ray start``) with ``num_cpus``
(the test's own, else ``--ray-cpus``; logical CPUs, none pre-started as
worker processes) and ``include_dashboard=False``.  A Ray already running
when a test calls ``ray.init`` is not shut down first: the test sees what a
verl user would.  A start that misses Ray's fixed 30 s for the raylet to
register (a loaded machine) is tried once more, saying so.  After each test
it shuts down a Ray left running; when the test passed (so it had shut Ray
down itself), that is an error of the test: something started Ray again.
Each test file runs in its own pytest process
(``tests/verl_parity/test_verl_parity.py``, the CI harness built on this
file, runs the single-controller files in one, as verl's CI does).

Typed errors: where verl raises a bare ``AssertionError`` on refused input,
dispatchcore raises a typed ``ValueError`` subclass on purpose.  On the
dispatchcore side ``pytest.raises(AssertionError, ...)`` also accepts a
dispatchcore ``ValueError`` (same ``match=``); such tests are listed as
``pass (typed)``, never as a plain pass.

Usage (needs the network for the registry; not part of CI)::

    python scripts/verl_parity.py --make-venv         # first time: builds /tmp/verl-venv
    python scripts/verl_parity.py -k decorator         # a subset of the files
    python scripts/verl_parity.py --scan              # static scan of verl's trainer code
    python scripts/verl_parity.py --trainer           # verl's RayPPOTrainer on stand-in workers

``--scan`` (``scripts/verl_scan.py``) downloads verl's wheel (no
dependencies, nothing installed) and lists every single-controller and
protocol name and attribute verl's trainer, workers and experimental code
use, with whether ours binds; its last line is ``covered K/N names``.
``--trainer`` (``scripts/verl_trainer_run.py``) runs verl's own
``verl/trainer/ppo/ray_trainer.py``, imports rewritten, in the venv.

The venv: ``python -m venv``; ``pip install torch==2.13.0 ray==2.60.0 pytest
pytest-asyncio pytest-timeout``; ``pip install verl==0.9.1 -c <torch==2.13.0,
ray==2.60.0>`` (verl's full dependency set; the pins stop it replacing torch
and Ray).  Exit status: 0 when every public test that passes on verl passes on
dispatchcore (plainly or typed), 1 otherwise, 2 when the harness itself failed.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

VERL_VERSION = "0.9.1"
TORCH_PIN = "torch==2.13.0"
RAY_PIN = "ray==2.60.0"
REPO = Path(__file__).resolve().parents[1]

#: verl module (exact, or a prefix followed by ".") -> dispatchcore module.
IMPORT_MAP = {
    "verl": "dispatchcore",
    "verl.protocol": "dispatchcore",
    "verl.single_controller.base": "dispatchcore",
    "verl.single_controller.ray": "executors_ray",
}
#: Modules kept as verl's: helpers the tests use to build or inspect data.
KEPT_PREFIXES = ("verl.utils",)
#: verl-internal helpers: imported from verl on the dispatchcore side; tests using them are reported apart.
VERL_INTERNAL_NAMES = frozenset(
    {
        "serialize_single_tensor",
        "deserialize_single_tensor",
        "serialize_tensordict",
        "deserialize_tensordict",
        "parallel_put",
    }
)
#: Test files taken from the sdist (globs relative to its root).
TEST_GLOBS = ("tests/test_protocol_on_cpu.py", "tests/single_controller/*_cpu.py")

CONFTEST = '''
"""Added by scripts/verl_parity.py: a local Ray per ray.init call, and (dispatchcore side) the typed-error lens."""
import json
import os
import sys

import pytest

RAY_CPUS = int(os.environ["VERL_PARITY_RAY_CPUS"])
TYPED_LOG = os.environ.get("VERL_PARITY_TYPED_LOG")
RESULTS = os.environ.get("VERL_PARITY_RESULTS")


if RESULTS:

    def pytest_runtest_logreport(report):
        """Each phase's outcome as it happens: a run that dies later keeps what it had."""
        with open(RESULTS, "a") as out:
            text = str(report.longrepr or "")[-4000:] if report.outcome != "passed" else ""
            line = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "text": text}
            out.write(json.dumps(line) + "\\n")


def _patch_ray():
    try:
        import ray
    except ImportError:
        return
    real_init = ray.init
    if getattr(real_init, "_verl_parity", False):
        return

    def local_init(*args, **kwargs):
        os.environ.pop("RAY_ADDRESS", None)
        kwargs["address"] = "local"  # None would join a cluster someone started with `ray start` on this machine
        kwargs.setdefault("num_cpus", RAY_CPUS)  # verl's pools reserve CPUs by the test's own count
        kwargs.update(include_dashboard=False, log_to_driver=False)
        try:
            return real_init(**kwargs)
        except Exception as exc:
            # Ray gives its raylet a fixed 30 s to register: a loaded machine, not the test, missed it.
            if "timed out during startup" not in str(exc):
                raise
            print("verl parity: Ray's node missed its 30 s start; starting it once more", file=sys.stderr)
            return real_init(**kwargs)

    local_init._verl_parity = True
    ray.init = local_init


_patch_ray()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "call":
        item._verl_parity_call = outcome.get_result()


@pytest.fixture(autouse=True)
def _no_ray_left_behind(request):
    """Shut down a Ray the test left running; after a passing test, one running is an error.

    verl's tests shut Ray down themselves, so after one that passed Ray is up
    only when something (a thread of the old session) started it again.
    """
    yield
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()
        call = getattr(request.node, "_verl_parity_call", None)
        if call is not None and call.passed:
            pytest.fail("Ray was initialized again after the test's own ray.shutdown() (a leftover thread called Ray)")


if TYPED_LOG:
    _typed = []
    _real_raises = pytest.raises

    def _accepts_assertion(expected):
        kinds = expected if isinstance(expected, tuple) else (expected,)
        return AssertionError in kinds

    class _TypedLens:
        """pytest.raises(AssertionError) that also takes a dispatchcore ValueError, and notes it."""

        def __init__(self, expected, kwargs):
            kinds = expected if isinstance(expected, tuple) else (expected,)
            self._inner = _real_raises((*kinds, ValueError), **kwargs)

        def __enter__(self):
            self._info = self._inner.__enter__()
            return self._info

        def __exit__(self, exc_type, value, tb):
            if isinstance(value, ValueError) and not isinstance(value, AssertionError):
                if not _raised_by_us(tb):
                    return False  # only a ValueError dispatchcore raises on purpose stands in for verl's assert
                _typed.append(f"{type(value).__name__}: {value}".splitlines()[0][:160])
            return self._inner.__exit__(exc_type, value, tb)

    def _raised_by_us(tb):
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = tb.tb_frame.f_code.co_filename if tb is not None else ""
        return any(f"{os.sep}{pkg}{os.sep}" in where for pkg in ("dispatchcore", "executors_ray"))

    def raises(expected, *args, **kwargs):
        if args or not _accepts_assertion(expected):
            return _real_raises(expected, *args, **kwargs)
        return _TypedLens(expected, kwargs)

    pytest.raises = raises

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item):
        _typed.clear()
        yield
        if _typed:
            with open(TYPED_LOG, "a") as log:
                log.write(json.dumps({"nodeid": item.nodeid, "errors": list(_typed)}) + "\\n")
'''


@dataclass
class Outcome:
    status: str  # pass | fail | error | skip | missing
    detail: str = ""


@dataclass
class FileReport:
    path: str
    internal_file: bool = False
    internal_tests: set[str] = field(default_factory=set)
    missing_names: dict[str, set[str]] = field(default_factory=dict)  # test -> names
    verl: dict[str, Outcome] = field(default_factory=dict)
    dispatchcore: dict[str, Outcome] = field(default_factory=dict)
    typed: dict[str, list[str]] = field(default_factory=dict)


# -- venv, sdist, install ---------------------------------------------------------------------------
def run(cmd: list[str], **kwargs: object) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def ensure_venv(venv: Path, make: bool) -> Path:
    python = venv / "bin" / "python"
    check = [str(python), "-c", f"import verl, sys; sys.exit(verl.__version__ != {VERL_VERSION!r})"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        has_timeout = [str(python), "-c", "import pytest_timeout, pytest_asyncio"]
        if subprocess.run(has_timeout, capture_output=True).returncode != 0:
            run([str(python), "-m", "pip", "install", "-q", "pytest-timeout", "pytest-asyncio"])
        return python
    if not make:
        sys.exit(
            f"no venv with verl {VERL_VERSION} at {venv}; run again with --make-venv (builds it, ~3 GB, "
            "a few minutes) or pass --venv PATH"
        )
    run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(python), "-m", "pip", "install", "-q"]
    run([*pip, TORCH_PIN, RAY_PIN, "pytest", "pytest-asyncio", "pytest-timeout"])
    pins = venv / "verl-parity-constraints.txt"
    pins.write_text(f"{TORCH_PIN}\n{RAY_PIN}\n")
    run([*pip, f"verl=={VERL_VERSION}", "-c", str(pins)])
    return python


def fetch_tests(python: Path, work: Path) -> Path:
    """verl's sdist, downloaded now and unpacked under ``work``; returns its root."""
    download = work / "sdist"
    pip = [str(python), "-m", "pip", "download", f"verl=={VERL_VERSION}", "--no-deps", "--no-binary", ":all:"]
    run([*pip, "-d", str(download), "-q"])
    (archive,) = download.glob(f"verl-{VERL_VERSION}.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(download, filter="data")
    return download / f"verl-{VERL_VERSION}"


def install_dispatchcore(python: Path, work: Path) -> Path:
    """This checkout installed into a folder of its own (first on PYTHONPATH for the dispatchcore run)."""
    source, target = work / "dispatchcore-src", work / "dispatchcore-site"
    for stale in (source, target):  # pip --target skips a package already there
        shutil.rmtree(stale, ignore_errors=True)
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    run([*pip, "--target", str(target), str(source)])
    return target


# -- rewriting ----------------------------------------------------------------------------------------
def target_module(module: str) -> str | None:
    """The dispatchcore module replacing verl ``module``, or None to keep verl's."""
    if module.startswith(KEPT_PREFIXES):
        return None
    best = max((k for k in IMPORT_MAP if module == k or module.startswith(k + ".")), key=len, default=None)
    if best is None:
        if module == "verl" or module.startswith("verl."):
            raise SystemExit(f"no mapping for verl module {module!r}: extend IMPORT_MAP or KEPT_PREFIXES")
        return None
    return IMPORT_MAP[best]


def exported(python: Path, site: Path, module: str) -> set[str]:
    code = f"import json, {module}; print(json.dumps(sorted(dir({module}))))"
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def rewrite(source: str, names_of: dict[str, set[str]], report: FileReport) -> str:
    """``source`` with its verl imports mapped; notes internal and missing names in ``report``."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    internal_names: set[str] = set()
    missing: set[str] = set()
    surface = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.startswith("verl.") for a in node.names):
            for alias in node.names:
                if target_module(alias.name) is not None:
                    raise SystemExit(f"{report.path}: 'import {alias.name}' needs a mapping rule")
            continue
        if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("verl"):
            continue
        module = node.module or ""
        target = target_module(module)
        if target is None:
            continue
        surface = True
        indent = " " * node.col_offset
        new: list[str] = []
        for alias in node.names:
            bound = alias.asname or alias.name
            if alias.name in names_of[target]:
                new.append(f"{indent}from {target} import {alias.name} as {bound}\n")
            elif alias.name in VERL_INTERNAL_NAMES:
                internal_names.add(bound)
                new.append(f"{indent}from {module} import {alias.name} as {bound}\n")
            else:
                missing.add(bound)
                new.append(f"{indent}{bound} = _verl_parity_missing({target!r}, {alias.name!r})\n")
        edits.append((node.lineno - 1, node.end_lineno or node.lineno, "".join(new)))
    for start, stop, text in sorted(edits, reverse=True):
        lines[start:stop] = [text]
    report.internal_file = not surface
    for func in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")):
        used = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)}
        if used & internal_names:
            report.internal_tests.add(func.name)
        if used & missing:
            report.missing_names[func.name] = used & missing
    stub = (
        "def _verl_parity_missing(module, name):\n"
        "    class Missing:\n"
        "        def __getattr__(self, attr):\n"
        "            raise NotImplementedError(f'{module} has no {name} (verl parity gap)')\n"
        "        def __call__(self, *a, **k):\n"
        "            raise NotImplementedError(f'{module} has no {name} (verl parity gap)')\n"
        "    return Missing()\n\n\n"
    )
    return stub + "".join(lines) if missing else "".join(lines)


# -- running ------------------------------------------------------------------------------------------
def run_side(
    python: Path, root: Path, rel: str, side: str, env_extra: dict[str, str], timeout: float, args: argparse.Namespace
) -> tuple[dict[str, Outcome], str]:
    junit = root / f"{Path(rel).stem}.{side}.xml"
    cmd = [str(python), "-m", "pytest", rel, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "-o"]
    cmd += ["junit_family=xunit2", "--timeout", str(args.test_timeout)]
    if side == "verl":
        cmd += ["-p", "no:dispatchcore"]
    # Logical CPUs (num_cpus=100 in some tests) must not become 100 pre-started Python workers.
    env = {**os.environ, "VERL_PARITY_RAY_CPUS": str(args.ray_cpus), "RAY_prestart_worker_first_driver": "0"}
    env.update(env_extra)
    env.pop("RAY_ADDRESS", None)
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        log = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        log = f"TIMEOUT after {timeout:g} s\n{exc.stdout or ''}"
    return parse_junit(junit), log


def parse_junit(path: Path) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    if not path.exists():
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "?")
        status, detail = "pass", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "fail" if child.tag == "failure" else "error"
                detail = (child.get("message") or "").splitlines()[0][:200] if child.get("message") else ""
            elif child.tag == "skipped":
                status, detail = "skip", (child.get("message") or "")[:200]
        out[name] = Outcome(status, detail)
    return out


def test_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]


# -- report ---------------------------------------------------------------------------------------------
def label(outcome: Outcome | None, typed: bool = False) -> str:
    if outcome is None:
        return "not run"
    if outcome.status == "pass" and typed:
        return "pass (typed)"
    return outcome.status


def print_report(reports: list[FileReport]) -> int:
    width = max((len(f"{Path(r.path).name}::{t}") for r in reports for t in r.verl | r.dispatchcore), default=40)
    regressions: list[str] = []
    counts = {"public": [0, 0, 0], "internal": [0, 0]}
    for group in ("public", "internal"):
        title = "Public surface" if group == "public" else "verl-internal helpers (reported apart)"
        print(f"\n== {title} ==")
        print(f"{'test':<{width}}  {'verl':<8}  dispatchcore")
        for r in reports:
            for test in sorted(set(r.verl) | set(r.dispatchcore), key=lambda t: (t not in r.verl, t)):
                internal = r.internal_file or test.split("[")[0] in r.internal_tests
                if (group == "internal") != internal:
                    continue
                v, d = r.verl.get(test), r.dispatchcore.get(test)
                typed = test in r.typed
                note = ""
                if d is not None and d.status in ("fail", "error") and d.detail:
                    note = f"   ({d.detail[:90]})"
                print(f"{Path(r.path).name + '::' + test:<{width}}  {label(v):<8}  {label(d, typed)}{note}")
                if group == "public":
                    if v is not None and v.status == "pass":
                        counts["public"][0] += 1
                        if d is not None and d.status == "pass":
                            counts["public"][2 if typed else 1] += 1
                        else:
                            regressions.append(f"{r.path}::{test}")
                else:
                    counts["internal"][0] += bool(v and v.status == "pass")
                    counts["internal"][1] += bool(d and d.status == "pass")
    verl_pass, plain, typed_n = counts["public"]
    print(
        f"\npublic tests passing on verl: {verl_pass}; passing on dispatchcore: {plain + typed_n} "
        f"({plain} plainly, {typed_n} with a typed ValueError where verl asserts)"
    )
    print(
        f"verl-internal helper tests passing on verl: {counts['internal'][0]} (dispatchcore: {counts['internal'][1]})"
    )
    for r in reports:
        for test, names in sorted(r.missing_names.items()):
            print(f"missing surface used by {Path(r.path).name}::{test}: {sorted(names)}")
        for test, errors in sorted(r.typed.items()):
            print(f"typed errors in {Path(r.path).name}::{test}: {errors[0]}" + (" ..." if len(errors) > 1 else ""))
    if regressions:
        print("\npass on verl but not on dispatchcore:\n  " + "\n  ".join(regressions))
        return 1
    return 0


def fetch_wheel(work: Path) -> Path:
    """verl's wheel, downloaded now (no dependencies) and unpacked under ``work``; returns the unpacked root."""
    import zipfile

    download = work / "wheel"
    run([sys.executable, "-m", "pip", "download", f"verl=={VERL_VERSION}", "--no-deps", "-d", str(download), "-q"])
    (wheel,) = download.glob(f"verl-{VERL_VERSION}-*.whl")
    root = work / "verl-src"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root)
    return root


def scan_or_trainer(args: argparse.Namespace) -> int:
    """``--scan``: ``scripts/verl_scan.py`` over verl's code; ``--trainer``: ``scripts/verl_trainer_run.py``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="verl-scan-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        src = args.verl_src or fetch_wheel(work)
        status = 0
        if args.scan:
            import verl_scan

            status |= verl_scan.main(["--verl-src", str(src), "--src", str(REPO / "src")])
        if args.trainer:
            import verl_trainer_run

            status |= verl_trainer_run.main(["--verl-src", str(src), "--venv", str(args.trainer_venv)])
        return status
    finally:
        if args.workdir is None and os.environ.get("VERL_PARITY_KEEP") != "1":
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=Path("/tmp/verl-venv"), help="venv with verl installed")
    parser.add_argument("--make-venv", action="store_true", help="build the venv if it is missing")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the sdist and rewritten tests here")
    parser.add_argument("--ray-cpus", type=int, default=8, help="num_cpus of a local Ray whose test names none")
    parser.add_argument("--test-timeout", type=int, default=300, help="seconds per test (pytest-timeout)")
    parser.add_argument("--file-timeout", type=int, default=1200, help="seconds per test file and side")
    parser.add_argument("-k", dest="only", default="", help="run only test files whose name contains this")
    parser.add_argument("--side", choices=("both", "verl", "dispatchcore"), default="both")
    parser.add_argument("--scan", action="store_true", help="static scan of verl's trainer code (no venv needed)")
    parser.add_argument("--trainer", action="store_true", help="run verl's RayPPOTrainer on stand-in workers")
    parser.add_argument("--verl-src", type=Path, default=None, help="unpacked verl wheel (default: download it)")
    parser.add_argument(
        "--trainer-venv", type=Path, default=Path("/tmp/verl-trainer-venv"), help="venv of the --trainer run"
    )
    args = parser.parse_args()
    if args.scan or args.trainer:
        return scan_or_trainer(args)

    python = ensure_venv(args.venv, args.make_venv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="verl-parity-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        sdist = fetch_tests(python, work)
        site = install_dispatchcore(python, work)
        names_of = {m: exported(python, site, m) for m in set(IMPORT_MAP.values())}
        rels = sorted({str(p.relative_to(sdist)) for g in TEST_GLOBS for p in sdist.glob(g)})
        rels = [r for r in rels if args.only in Path(r).name]
        roots = {"verl": work / "run-verl", "dispatchcore": work / "run-dispatchcore"}
        reports: list[FileReport] = []
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            (root / "conftest.py").write_text(CONFTEST)
        for rel in rels:
            report = FileReport(rel)
            text = (sdist / rel).read_text()
            for side, root in roots.items():
                dest = root / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(text if side == "verl" else rewrite(text, names_of, report))
            reports.append(report)
        typed_log = work / "typed.jsonl"
        typed_log.unlink(missing_ok=True)
        envs = {
            "verl": {},
            "dispatchcore": {
                "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "VERL_PARITY_TYPED_LOG": str(typed_log),
            },
        }
        for report in reports:
            for side in ("verl", "dispatchcore"):
                if args.side not in ("both", side):
                    continue
                outcomes, log = run_side(python, roots[side], report.path, side, envs[side], args.file_timeout, args)
                for name in test_names(roots[side] / report.path):
                    outcomes.setdefault(name, Outcome("missing", "not reported (crash or timeout)"))
                setattr(report, side, outcomes)
                (work / f"{Path(report.path).stem}.{side}.log").write_text(log)
                passed = sum(o.status == "pass" for o in outcomes.values())
                print(f"{report.path} [{side}]: {passed}/{len(outcomes)} passed", flush=True)
        if typed_log.exists():
            for line in typed_log.read_text().splitlines():
                entry = json.loads(line)
                path, _, test = entry["nodeid"].partition("::")
                for report in reports:
                    if report.path == path:
                        report.typed[test] = entry["errors"]
        print(f"\nlogs and rewritten tests: {work}")
        return print_report(reports)
    finally:
        if args.workdir is None and os.environ.get("VERL_PARITY_KEEP") != "1":
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        print(f"harness step failed: {exc}", file=sys.stderr)
        sys.exit(2)
