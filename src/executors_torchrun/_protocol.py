"""Control messages between the hub (rank 0, the driver) and the other ranks.

Every message is a small pickled tuple.  Commands and statuses travel on
each rank's control link to the hub (``_control``); a rank waits for them in
a socket read, never in gloo, so idle ranks can wait forever.  Lazy rows'
requests and answers (below) use c10d store queues.  Tensor payloads follow
separately, point to point, their first tag named in the message.

Commands (hub to rank)::

    ("start", cid, gid, group_rank, group_size, header, first_tag, env, death_timeout, isolate)
                                               env: a spare's rank variables (or None);
                                               death_timeout: the group's, bounding row fetches
    ("call", cid, gid, method, [(slot, header, first_tag)], arg_slots, kwarg_slots, instructions)
                                               instructions: the call's ``Call.instructions``,
                                               forwarded whole to ``WorkerHost.run``
    ("close", gid)
    ("stop",)

Statuses (rank to hub)::

    ("done", cid, True, None, 0, None)         the value None (no header, no payload)
    ("done", cid, True, header, first_tag, layout)
                                               a value follows on the data path; layout
                                               (or None) names a DataProto result's tensor
                                               buffers, so the hub can place their rows
    ("done", cid, False, RemoteFailure, 0)     the worker (or unpickling) raised
    ("stopped", host, pid)                     acknowledged "stop", exiting

Rows of lazy results, between any two processes of a world (``_row_plane``)::

    rows/<rank>   ("fetch", requester, fetch_id, [RowRequest])    to the producing process
                  ("quit",)                                       ends its data thread
    rowsre/<rank> ("rows", fetch_id, producer, header, first_tag) payload posted, row tags
                  ("failed", fetch_id, producer, message)         e.g. the rows were freed
                  ("dead", fetch_id, producer, detail)            pushed by the consumer's watcher
                  ("stopped", fetch_id)                           the world is stopping
    dead/<rank>   set by the hub once it knows that process is gone (its detail)

Rows for a consumer in another self-started world (``_bridge_rows``), in the producing world's store::

    rows/<rank>   ("bridge", bridge_id, generation, fetch_id, [RowRequest], timeout)
    rowsbridge/<bridge_id>
                  ("rows", fetch_id, producer, header, first_tag, generation)   sent over the pair's bridge
                  ("failed" | "dead" | "stopped", ...)                           as above
"""

from __future__ import annotations

import pickle
from typing import Any

#: Blocking pops wait this long; nothing times out on purpose (a store-side
#: timeout leaves the client socket out of step, so waiters are woken by a
#: message instead).
FOREVER_S = 365 * 24 * 3600


def heartbeat_key(rank: int) -> str:
    return f"hb/{rank}"


def rows_key(rank: int) -> str:
    """Row requests to process ``rank`` (its data thread pops them)."""
    return f"rows/{rank}"


def rows_reply_key(rank: int) -> str:
    """Answers to process ``rank``'s row requests (one fetch at a time per process)."""
    return f"rowsre/{rank}"


def dead_key(rank: int) -> str:
    return f"dead/{rank}"


STOPPING_KEY = "stopping"
READY_KEY = "ready"


def encode(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(raw: bytes) -> tuple[Any, ...]:
    message: tuple[Any, ...] = pickle.loads(raw)  # noqa: S301 - peers of one job, through its own store
    return message
