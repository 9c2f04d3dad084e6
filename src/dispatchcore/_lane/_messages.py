"""What travels on a rank's two lane links, and how a connecting link says which one it is.

Each rank opens two links to its driver's door: the *call* link, read by
the rank's method thread between calls, and the *control* link, read by a
thread that never runs worker code, so it answers while a method runs.  A
control link names itself with the rank plus :data:`CONTROL_LINK`.

Driver to rank, call link::

    (START, cid, boot, world_size, isolate)   build the worker: boot is (worker class, init args, init kwargs)
    (CALL, cid, method, instructions, parts, arg_slots, kwarg_slots)   one call (``_envelope``)

Rank to driver, call link::

    (DONE, cid, ok, part)                     the call's outcome; ``part`` None is the value None

Control link, driver to rank and back::

    (PING, n) -> (PONG, n)                    answered at once, even mid-call
    (CANCEL, call_id)                         ``cancel_in_process(call_id)`` beside the running call
    (STACKS, sid, all_threads) -> (STACKS, sid, text)   ``thread_stacks`` of the method thread
"""

from __future__ import annotations

#: Added to the rank number a control link gives in its handshake.
CONTROL_LINK = 1 << 30

START = "start"
CALL = "call"
DONE = "done"
PING = "ping"
PONG = "pong"
CANCEL = "cancel"
STACKS = "stacks"
