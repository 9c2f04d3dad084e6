"""An executor that drops ``Call.instructions`` fails the conformance suite's lazy cases (they watch driver traffic)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from dispatchcore.executor import PLAIN, Call, RankCallHandle, register_executor
from dispatchcore.testing import MockExecutor
from dispatchcore.testing.conformance import ExecutorConformance
from dispatchcore.testing.workers import EchoWorker


class InstructionDroppingExecutor(MockExecutor):
    """The mock executor, but it forgets the core's instructions (keep the rows, time the call)."""

    name = "mock-dropping-instructions"

    def submit(self, call: Call) -> RankCallHandle:
        call.instructions = PLAIN
        return super().submit(call)


class DroppingConformance(ExecutorConformance):
    backend: ClassVar[str] = InstructionDroppingExecutor.name
    ranks_are_processes: ClassVar[bool] = False


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    register_executor(InstructionDroppingExecutor)


@pytest.mark.parametrize(
    "case",
    ["test_lazy_results_equal_eager_in_every_dataproto_mode", "test_lazy_column_read_fetches_that_column_only"],
)
def test_a_lazy_case_fails_when_the_instructions_are_dropped(case: str) -> None:
    group: Any = DroppingConformance.make_group(EchoWorker, DroppingConformance.world_size, init_kwargs={"tag": "x"})
    try:
        group.set_mesh(2)
        with pytest.raises(AssertionError):
            getattr(DroppingConformance(), case)(group)
    finally:
        group.shutdown()
