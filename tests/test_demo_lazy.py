"""``dispatchcore demo --lazy`` prints the same learning numbers with fewer bytes through the driver."""

from __future__ import annotations

import pytest

from dispatchcore.demo import DemoConfig, run_demo
from dispatchcore.demo.loop import main

STEPS = 3


def printed_rows(out: str) -> list[list[str]]:
    """The step rows of the demo's table: step, reward, loss, kl, ..., bytes via driver."""
    return [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]


def kilobytes(cell: str) -> float:
    assert cell.endswith("KB"), cell
    return float(cell[:-2])


def run_cli(capsys: pytest.CaptureFixture[str], *flags: str) -> list[list[str]]:
    assert main(["--backend", "local", "--steps", str(STEPS), *flags]) == 0
    rows = printed_rows(capsys.readouterr().out)
    assert len(rows) == STEPS, rows
    return rows


def test_lazy_demo_prints_the_same_numbers_with_less_driver_traffic(capsys: pytest.CaptureFixture[str]) -> None:
    eager = run_cli(capsys)
    lazy = run_cli(capsys, "--lazy")
    # step, reward, loss, kl: the same text (the same numbers to the printed digits).
    assert [row[:4] for row in lazy] == [row[:4] for row in eager]
    # Eager, every column crosses the driver once or more per call; lazy, only the driver's own columns
    # (prompts, advantages) go out and ``rewards`` comes back: about half.  3/4 catches a lazy path
    # that quietly pulls the rows to the driver (e.g. ``plain.union(lazy)`` materializing).
    for eager_row, lazy_row in zip(eager, lazy, strict=True):
        assert kilobytes(eager_row[-1]) > 0
        assert kilobytes(lazy_row[-1]) <= 0.75 * kilobytes(eager_row[-1]), (eager_row, lazy_row)


def test_lazy_demo_trains_to_identical_numbers_with_padding() -> None:
    """Three ranks split 124 rows unevenly (padding); lazy and eager still agree exactly."""
    config = {"backend": "local", "world_size": 3, "steps": 2}
    eager = run_demo(DemoConfig(**config))
    lazy = run_demo(DemoConfig(**config, lazy=True))
    assert [(m.reward, m.loss, m.kl) for m in lazy] == [(m.reward, m.loss, m.kl) for m in eager]
    assert all(lz.driver_bytes < eg.driver_bytes for lz, eg in zip(lazy, eager, strict=True))
