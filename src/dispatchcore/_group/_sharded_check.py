"""Before the next call after a failed one: every rank's sharded state checked, and recovered where it must be.

A group whose worker declares ``sharded_modules`` is checked once after any
failed, timed-out or cancelled call (a rank's death included), before the
next call goes out (a replacement's rejoin runs the hook itself): every rank reports its FSDP2 state
(:func:`dispatchcore._worker._sharded.sharded_report`).  If every rank is
fit and they agree, the call runs at once.  If not, every rank runs the
worker's ``recover_sharded_state`` and reports again; without that hook, or
if it did not make the ranks fit, the call is refused with a
:class:`~dispatchcore.DispatchError` naming the hook and what is wrong
(``docs/process-groups.md``).  The check stays due until it passes.
"""

from __future__ import annotations

from typing import Any

from .._base import DispatchError, WorkerError
from .._spi import Call, Instructions, Operation
from .._worker import SHARDED_CALL, declares_sharded, sharded_hooks

#: Core operations that run without the check: a replacement's rejoin (which runs the hook itself), a resize,
#: the check itself.
_EXEMPT = (Operation.REJOIN, Operation.RESIZE, Operation.SHARDED)


def check_before(site: Any, call: Call) -> None:
    """Run the check if one is due and ``call`` is not exempt (the submit path calls this on every call)."""
    if not site.shared.sharded_check_due or call.beside or call.instructions.operation in _EXEMPT:
        return
    shared = site.shared
    root = shared.root() if shared.root is not None else None
    worker_cls = getattr(root, "worker_cls", None)
    if root is None or worker_cls is None or not declares_sharded(worker_cls):
        shared.sharded_check_due = False
        return
    ranks = tuple(range(root.world_size))
    reports = _ask(shared, "check", ranks, root.call_timeout, "the sharded-state check")
    wrong = _wrong(reports)
    if wrong:
        hooks = sharded_hooks(worker_cls)
        missing = " and ".join(name for name, defined in hooks.items() if not defined)
        if missing:
            raise DispatchError(
                f"{root!r} will not run {call.method!r} on a half-broken sharded model: after a failed call, "
                f"{wrong}. Define {missing}: it runs on every rank when this check fails (rebuild the model, "
                "fully_shard and the optimizer, then load the last checkpoint or a copy it kept); see "
                "docs/process-groups.md"
            )
        hook = " and ".join(hooks)
        reports = _ask(shared, "recover", ranks, root.call_timeout, hook)
        still = _wrong(reports)
        if still:
            raise DispatchError(
                f"{root!r} will not run {call.method!r}: {hook} ran on every rank, and still {still}. Make it "
                "rebuild every module in sharded_modules and every optimizer in sharded_optimizers (after the model)"
            )
    shared.sharded_check_due = False


def _ask(shared: Any, step: str, ranks: tuple[int, ...], timeout: float | None, what: str) -> list[Any]:
    orders = Instructions(operation=Operation.SHARDED)
    call = Call(
        SHARDED_CALL, ranks, [(step,) for _ in ranks], [{} for _ in ranks], timeout=timeout, instructions=orders
    )
    try:
        return list(shared.executor.submit(call).result(timeout))
    except WorkerError as exc:
        raise DispatchError(
            f"{what} failed on rank {exc.rank}: {exc.exc_type}: {exc.exc_message}; the next call runs only "
            "after it passes"
        ) from exc


def _wrong(reports: list[Any]) -> str:
    """What is wrong across the ranks' reports, in words; empty when every rank is fit and they agree."""
    lines = [f"rank {rank}: {'; '.join(report.problems)}" for rank, report in enumerate(reports) if report.problems]
    signatures = {report.signature for report in reports}
    if not lines and len(signatures) > 1:
        by_rank = ", ".join(
            f"rank {rank}: {' '.join(f'{name}={state}' for name, state in report.signature)}"
            for rank, report in enumerate(reports)
        )
        lines.append(f"the ranks' sharded states differ, so they would issue different collectives ({by_rank})")
    return "; ".join(lines)
