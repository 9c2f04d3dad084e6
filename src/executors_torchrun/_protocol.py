"""Store keys and messages between the driver and the other processes of a world.

Calls travel on the core's lane; the store carries only what a process must
learn before it has a lane, and lazy rows' requests and answers (small pickled tuples).

Joining and leaving (driver to each process, a queue per data rank)::

    join/<rank>   ("join", gid, group_rank, env, death_timeout)
                                               serve rank ``group_rank`` of group ``gid``: its lane
                                               address is under ``lane/<gid>`` (``StoreDirectory``); env: a
                                               spare's rank variables (or None)
                  ("stop",)                    leave: the world is over
    stopped/<rank> "host pid"                  set by a process as it leaves (the driver waits for its end)

Rows of lazy results, between any two processes of a world (``_row_plane``)::

    rows/<rank>   ("fetch", requester, fetch_id, [RowRequest])    to the producing process
                  ("free", [key])                                 drop kept rows now
                  ("quit",)                                       ends its data thread
                  ("transport", generation, [rank])               join the row transport's next generation
    transport/<generation>/<rank>  "" once joined, else why not (the driver waits for every member)
    rowsre/<rank> ("rows", fetch_id, producer, header, first_tag, generation)
                                                  payload posted on that generation, row tags
                  ("failed", fetch_id, producer, message)         e.g. the rows were freed
                  ("dead", fetch_id, producer, detail)            pushed by the consumer's watcher
                  ("stopped", fetch_id)                           the world is stopping
    dead/<rank>   set by the driver once its lane knows that process is gone (its detail)

Rows for a consumer in another self-started world (``_bridge_rows``), in the producing world's store::

    rows/<rank>   ("bridge", bridge_id, generation, fetch_id, [RowRequest], timeout)
    rowsbridge/<bridge_id>
                  ("rows", fetch_id, producer, header, first_tag, generation)   sent over the pair's bridge
                  ("failed" | "dead" | "stopped", ...)                           as above
"""

from __future__ import annotations

import pickle
from typing import Any

import torch.distributed as dist

from dispatchcore.executor import LaneAddress

#: Blocking pops wait this long; nothing times out on purpose (a store-side
#: timeout leaves the client socket out of step, so waiters are woken by a
#: message instead).
FOREVER_S = 365 * 24 * 3600


def join_key(rank: int) -> str:
    return f"join/{rank}"


def stopped_key(rank: int) -> str:
    return f"stopped/{rank}"


def lane_key(gid: str) -> str:
    return f"lane/{gid}"


def rows_key(rank: int) -> str:
    return f"rows/{rank}"


def rows_reply_key(rank: int) -> str:
    return f"rowsre/{rank}"


def dead_key(rank: int) -> str:
    return f"dead/{rank}"


def transport_key(generation: int, rank: int) -> str:
    return f"transport/{generation}/{rank}"


STOPPING_KEY = "stopping"
READY_KEY = "ready"


def encode(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(raw: bytes) -> tuple[Any, ...]:
    message: tuple[Any, ...] = pickle.loads(raw)  # noqa: S301 - peers of one job, through its own store
    return message


class StoreDirectory:
    """The core's :class:`~dispatchcore.executor.LaneDirectory` on the world's store (only its processes see the token).

    A lookup waits as ``store.get`` does.
    """

    def __init__(self, store: dist.Store, key: str) -> None:
        self._store = store
        self._key = key

    def publish(self, address: LaneAddress) -> None:
        self._store.set(self._key, address.encode().encode())  # type: ignore[arg-type]  # the binding takes bytes

    def lookup(self) -> LaneAddress:
        return LaneAddress.decode(self._store.get(self._key))


def pop(store: dist.Store, key: str) -> tuple[Any, ...]:
    """The next message on queue ``key``, however long it takes; raises once the store is gone."""
    while True:
        try:
            return decode(store.queue_pop(key, True))
        except dist.QueueEmptyError:  # seen rarely on a blocking pop: just wait again
            continue


def home_of(store: dist.Store) -> tuple[str, int]:
    """``(host, port)`` of the ``TCPStore`` under ``store`` (its world's, when compared)."""
    raw: Any = store._underlying_non_prefix_store if isinstance(store, dist.PrefixStore) else store  # type: ignore[attr-defined]
    return str(raw.host), int(raw.port)
