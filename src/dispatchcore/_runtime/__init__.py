"""The rank side every executor shares: ``WorkerHost``, rank threads, isolation copies, the call handle
that owns every time bound."""

from ._call_handle import RankCallHandle, liveness_poll
from ._cancel import INTERRUPT_SIGNAL, cancel_in_process, install_cancel_signal
from ._isolation import ATOMS, check_copyable, isolated_copy
from ._process_end import process_alive, wait_processes_ended
from ._rank_thread import RankThread, run_isolated
from ._stacks import note_stacks_soon, stacks_note, thread_stacks
from ._timeout_wording import timeout_error
from ._unpicklable import check_spec_picklable, unpicklable_call_error, unpicklable_error, unpicklable_spec_error
from ._worker_host import RemoteFailure, WorkerHost, first_failure

__all__ = [
    "ATOMS",
    "INTERRUPT_SIGNAL",
    "RankCallHandle",
    "RankThread",
    "RemoteFailure",
    "WorkerHost",
    "cancel_in_process",
    "check_copyable",
    "check_spec_picklable",
    "first_failure",
    "install_cancel_signal",
    "isolated_copy",
    "liveness_poll",
    "note_stacks_soon",
    "process_alive",
    "run_isolated",
    "stacks_note",
    "thread_stacks",
    "timeout_error",
    "unpicklable_call_error",
    "unpicklable_error",
    "unpicklable_spec_error",
    "wait_processes_ended",
]
