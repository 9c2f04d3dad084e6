"""What travels on a rank's two lane links, and how a connecting link says which one it is.

The *call* link is read by the rank's method thread between calls; the
*control* link by a thread that never runs worker code, so it answers while
a method runs (it names itself with the rank plus :data:`CONTROL_LINK`)::

    call, driver -> rank:  (START, cid, boot, world_size, isolate)
                           (CALL, cid, method, instructions, parts, arg_slots, kwarg_slots)
    call, rank -> driver:  (DONE, cid, ok, part)            ``part`` None is the value None
    control:               (PING, n) -> (PONG, n); (CANCEL, call_id);
                           (STACKS, sid, all_threads) -> (STACKS, sid, text)
                           (BESIDE, cid, method, instructions, parts, arg_slots, kwarg_slots)
                               -> (DONE, cid, ok, part)   the core's own beside calls (row reads and
                               frees), run on the rank's beside thread while any call runs
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
BESIDE = "beside"
