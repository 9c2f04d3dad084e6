"""A weight transfer inside a ``trace()`` block on Ray: the bucket's ``ObjectRef`` still reaches the destinations.

Traced ranks wrap each result with its timing; a Ray reference pickled
inside that wrapper lost its owner and the destination's step could not be
sent ("a Ray object whose owner is unknown"). The lane now hands the
reference over as it is.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dispatchcore import WeightSync, WorkerGroup, trace
from dispatchcore.testing.weight_workers import WeightRollout, WeightTrainer, expected, make_weights


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_traced_transfer_arrives_and_shows_its_buckets(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "ray":
        request.getfixturevalue("ray_session")
    with WorkerGroup(WeightTrainer, 2, backend=backend) as src, WorkerGroup(WeightRollout, 2, backend=backend) as dst:
        with trace() as tracer:
            report = WeightSync(src, dst, bucket_bytes=100)(version=2)
        full = make_weights()
        for rank, (got, version, _) in enumerate(dst.state()):
            assert version == 2
            assert all(torch.equal(got[name], expected(t, None, rank, 2)) for name, t in full.items())
    names: list[Any] = [event["name"] for event in tracer.events if event["ph"] == "X"]
    assert sum(name.startswith("WeightSync pack bucket") for name in names) == report.buckets
