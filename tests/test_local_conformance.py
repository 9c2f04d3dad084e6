"""The conformance suite on the in-process executor."""

from dispatchcore.testing.conformance import ExecutorConformance


class TestLocalConformance(ExecutorConformance):
    backend = "local"
    ranks_are_processes = False
