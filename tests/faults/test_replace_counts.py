"""Errors that count: too few spares for the ranks to replace, and the fix offered after a death.

Deaths are real (``SIGKILL`` of the rank's process); groups are fresh.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import cloudpickle
import pytest

from dispatchcore import DispatchError, WorkerDiedError, WorkerGroup

from . import _replace_workers
from ._harness import backend_params
from ._replace_workers import Restartable

cloudpickle.register_pickle_by_value(_replace_workers)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.mark.parametrize("backend", backend_params(("torchrun",)))
def test_too_few_spares_counts_the_dead_and_stuck_ranks(backend: str, tmp_path: Path) -> None:
    """Rank 1 dies while ranks 0 and 2 stay in the call past cancel_grace: three to replace, one spare."""
    with WorkerGroup(
        Restartable, 3, backend=backend, on_rank_death="replace", spare_ranks=1, cancel_grace=0.5, death_timeout=10
    ) as wg:
        try:
            with pytest.raises(DispatchError) as info:
                wg.die_while_others_hold(1, str(tmp_path))
        finally:
            (tmp_path / "release").touch()
    message = str(info.value)
    assert not isinstance(info.value, WorkerDiedError), message
    assert message.startswith(
        "3 ranks need replacing (1 dead, 2 stuck); 1 spare left: create the group with spare_ranks=3"
    ), message


@pytest.fixture(params=backend_params(("ray", "torchrun")))
def spareless(request: pytest.FixtureRequest) -> str:
    """A backend of default options (Ray gets the session's Ray before the test starts)."""
    name: str = request.param
    if name == "ray":
        request.getfixturevalue("ray_session")
    return name


def test_after_a_death_the_refusal_offers_replace_rank_where_it_works(spareless: str) -> None:
    """Default options: Ray can restart the rank, so the next call's refusal says how; spareless torchrun cannot."""
    backend = spareless
    with WorkerGroup(Restartable, 2, backend=backend, death_timeout=10) as wg:
        wg.configure("cfg")
        os.kill(wg.pid()[1], signal.SIGKILL)
        with pytest.raises(WorkerDiedError):
            wg.state()
        with pytest.raises(DispatchError, match="can take no more calls: rank 1 died") as refused:
            wg.state()
        message = str(refused.value)
        if backend == "torchrun":  # no spare process: a new group is the only way
            assert "replace_rank" not in message and message.endswith("Shut it down and create a new one"), message
            return
        assert "Restart the lost rank(s) with wg.replace_rank(1)" in message, message
        assert message.endswith("or shut it down and create a new one"), message
        wg.replace_rank(1)
        assert [r[0] for r in wg.state()] == [0, 1]
