"""Self-started torchrun ranks' output reaches the driver's terminal, prefixed with group and rank."""

from __future__ import annotations

import sys

import pytest

from dispatchcore import Dispatch, Worker, WorkerGroup, register

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class Talker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def talk(self) -> None:
        print(f"hello from {self.rank}")
        print(f"warning from {self.rank}", file=sys.stderr)


def test_rank_output_is_prefixed(capsys: pytest.CaptureFixture[str]) -> None:
    with WorkerGroup(Talker, 2, backend="torchrun", name="talkers") as wg:
        wg.talk()
    out, err = capsys.readouterr()  # shutdown joined the relays: every line is in
    for rank in (0, 1):
        assert f"(talkers rank {rank}) hello from {rank}\n" in out
        assert f"(talkers rank {rank}) warning from {rank}\n" in err
