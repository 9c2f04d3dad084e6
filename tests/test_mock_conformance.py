"""The conformance suite on the ``mock`` executor (``dispatchcore.testing.MockExecutor``)."""

from __future__ import annotations

from dispatchcore.testing.conformance import ExecutorConformance


class TestMockConformance(ExecutorConformance):
    backend = "mock"
    ranks_are_processes = False  # ranks live in the test process: the cases that kill one are skipped
    ranks_run_together = False  # one thread runs each call's ranks in turn
