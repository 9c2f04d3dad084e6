"""How a call is split and gathered: modes, ``@register``, futures, the call context."""

from ._builtin_modes import collect_list, concat_outputs, dispatch_all_to_all, trim_padding
from ._call_context import CallContext, current_call, enter_call, leave_call
from ._direct_call import DirectCall, direct_call
from ._enum import Execute
from ._futures import CallFuture, as_completed
from ._modes import Dispatch, register_dispatch_mode, resolve_mode, unregister_dispatch_mode, update_dispatch_mode
from ._nd_dispatch import make_nd_compute_dataproto_dispatch_fn
from ._proto_future import DataProtoFuture
from ._register import register
from ._registration import REGISTRATION_ATTR, Registration, registered_methods
from ._spec import DispatchSpec

__all__ = [
    "REGISTRATION_ATTR",
    "CallContext",
    "CallFuture",
    "DataProtoFuture",
    "DirectCall",
    "Dispatch",
    "DispatchSpec",
    "Execute",
    "Registration",
    "as_completed",
    "collect_list",
    "concat_outputs",
    "current_call",
    "direct_call",
    "dispatch_all_to_all",
    "enter_call",
    "leave_call",
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "registered_methods",
    "resolve_mode",
    "trim_padding",
    "unregister_dispatch_mode",
    "update_dispatch_mode",
]
