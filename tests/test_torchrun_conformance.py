"""The conformance suite on the torchrun executor (self-started ranks)."""

import pytest

from dispatchcore.testing.conformance import ExecutorConformance

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class TestTorchrunConformance(ExecutorConformance):
    backend = "torchrun"
    ranks_are_processes = True
