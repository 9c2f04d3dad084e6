"""The package as users install it: a built wheel, in a fresh venv, not editable.

An editable install sees the source tree, so a file missing from the wheel
(``py.typed``, a package, an entry point) would pass every other test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROBE = textwrap.dedent(
    """
    import importlib.metadata as md, json, pathlib, sys
    import dispatchcore
    from dispatchcore import available_backends
    pkg = pathlib.Path(dispatchcore.__file__).parent
    dist = md.distribution("dispatchcore")
    print(json.dumps({
        "file": dispatchcore.__file__,
        "py_typed": (pkg / "py.typed").is_file(),
        "entry_points": sorted(e.name for e in md.entry_points(group="dispatchcore")),
        "scripts": sorted(
            e.name for e in md.entry_points(group="console_scripts") if e.value.startswith("dispatchcore")
        ),
        "backends": available_backends(),
        "requires_python": dist.metadata["Requires-Python"],
        "installer_direct_url": dist.read_text("direct_url.json"),
    }))
    """
)


def _site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done


def test_wheel_installs_with_its_entry_points_backends_and_types(tmp_path: Path) -> None:
    # Build from a copy so no build/ or egg-info lands in the checkout.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    _run([*build, str(source)])
    (wheel,) = wheels.glob("dispatchcore-*.whl")

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # The wheel goes into the new venv without its dependencies; torch, numpy,
    # pluggy and ray come from this test run's environment, appended after the
    # venv's own site-packages so the installed wheel (not the checkout) wins.
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)])
    ours = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "torch").is_dir())
    (_site_packages(env_dir) / "zz_test_deps.pth").write_text(f"{ours}\n")

    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DISPATCHCORE_DISABLED_PLUGINS"}}
    probe = json.loads(_run([str(python), "-c", PROBE], env=env, cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert Path(probe["file"]).is_relative_to(env_dir), f"imported from {probe['file']}, not the installed wheel"
    assert probe["installer_direct_url"] is None or '"editable": true' not in probe["installer_direct_url"]
    assert probe["py_typed"], "py.typed is missing from the wheel"
    assert {"local", "ray", "torchrun"} <= set(probe["entry_points"])
    assert probe["scripts"] == ["dispatchcore"]
    assert {"local", "ray", "torchrun"} <= set(probe["backends"])
    assert probe["requires_python"] == ">=3.11"

    script = env_dir / "bin" / "dispatchcore"
    assert script.is_file(), "the dispatchcore command was not installed"
    listing = _run([str(script), "backends"], env=env, cwd=tmp_path).stdout
    for backend in ("local", "ray", "torchrun"):
        assert backend in listing
