"""The store a Ray group's driver hosts for its ranks' collectives: where it listens, and how long it lives.

``TCPStore(host, 0, is_master=True)`` listens on every interface whatever ``host`` says, and a
store has no authentication: the socket is bound to ``host`` here (loopback when every actor
shares the driver's node) and handed over as ``master_listen_fd``.  At shutdown the store
outlives the actors it served: a rank whose store vanished under it prints torch's C++ trace.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from dispatchcore.executor import StoreCollective, wait_processes_ended

from ._runtime import in_session

#: How long a shut-down group's store waits, at most, for its killed actors to be gone.
OUTLIVE_S = 10.0
#: How long one round of asking the killed actors whether they are gone may take.
_PROBE_S = 0.5


def serve_store(host: str) -> tuple[Any, str]:
    """A store listening on ``host`` only: ``(store, "host:port")`` (the value of ``COLLECTIVE_STORE_ENV``)."""
    return StoreCollective.serve(host)


def outlive(ray: Any, session: str, actors: Sequence[Any], store: Any, pids: Sequence[int] = ()) -> None:
    """Keep ``store`` until the killed ``actors`` are gone (at most :data:`OUTLIVE_S`), on a daemon thread.

    Ray calls an actor dead once its kill is decided, before its process has ended: ``pids``, the
    ranks on this node, are awaited as processes too (a rank elsewhere only as Ray sees it).
    """
    if store is None or not (actors or pids):
        return
    threading.Thread(
        target=_hold, args=(ray, session, list(actors), store, list(pids)), name="dispatchcore-ray-store", daemon=True
    ).start()


def _hold(ray: Any, session: str, actors: list[Any], store: Any, pids: list[int]) -> None:
    deadline = time.monotonic() + OUTLIVE_S
    _await_actors(ray, session, actors, deadline)
    wait_processes_ended(pids, deadline)
    del store  # now the ranks' clients are gone with their processes


def _await_actors(ray: Any, session: str, actors: list[Any], deadline: float) -> None:
    """Until Ray calls every actor gone; then ``actors`` is emptied: no handle or reference of Ray's outlives
    this call (one dropped after the user's ``ray.shutdown()`` ends the process)."""
    with contextlib.suppress(Exception):  # Ray shutting down meanwhile: its actors go with it
        while actors and time.monotonic() < deadline and in_session(ray, session):
            probes = [actor.__ray_ready__.remote() for actor in actors]
            ray.wait(probes, num_returns=len(probes), timeout=_PROBE_S)
            actors[:] = [actor for actor, probe in zip(actors, probes, strict=True) if not _gone(ray, probe)]
            del probes
            if actors:
                time.sleep(0.05)
    actors.clear()


def _gone(ray: Any, probe: Any) -> bool:
    """Whether the probe says its actor is gone (it failed as a dead actor's task fails)."""
    try:
        ray.get(probe, timeout=0)
    except ray.exceptions.RayActorError:
        return True
    except Exception:  # noqa: BLE001 - not answered yet
        return False
    return False
