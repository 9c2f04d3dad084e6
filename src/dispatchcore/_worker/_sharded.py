"""After a failed call, whether a worker's FSDP2 modules and optimizers are still fit to step: the rank side.

A rank that raised (or was cancelled) inside a forward or backward leaves
FSDP2 mid-step on every rank it reached: parameter groups not idle, the
root's parameters unsharded plain tensors the optimizer no longer holds.
The next step would then run on a half-broken model, or issue collectives
the other ranks do not (``docs/process-groups.md``).  So a worker declares
what is sharded (:attr:`Worker.sharded_modules` and
:attr:`Worker.sharded_optimizers`, attribute names), and after a failed call
the driver asks every rank for :func:`sharded_report` before the next call:
if a rank reports a problem, or the ranks' states differ, every rank runs
:meth:`Worker.recover_sharded_state` and reports again.

FSDP2 keeps its state in private attributes; :func:`fsdp_states` reads them
for torch 2.13 and raises naming the torch version where they moved (a test
reads them on every run, so a torch upgrade that moves them fails there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._base import DispatchError

#: The check's name in errors and traces (``Operation.SHARDED``: it calls no worker method by a reserved name).
SHARDED_CALL = "<sharded-state check>"
#: The recovery hook a worker overrides.
SHARDED_HOOK = "recover_sharded_state"


@dataclass(frozen=True)
class ShardedReport:
    """One rank's view of its sharded state: what must agree across ranks, and what is wrong on this rank."""

    #: Per FSDP2 module (``attr.qualname``): whether its parameters are sharded; per optimizer: its size.
    signature: tuple[tuple[str, str], ...]
    #: What makes a step unsafe on this rank (empty: fit).
    problems: tuple[str, ...]


def declares_sharded(worker_cls: type) -> bool:
    """Whether ``worker_cls`` (or a role colocated in it) names sharded modules: the driver checks such groups."""
    return any(getattr(cls, "sharded_modules", ()) for _, cls in _parts(worker_cls))


def sharded_hooks(worker_cls: type) -> dict[str, bool]:
    """``Class.recover_sharded_state()`` of each part (role) declaring sharded modules: whether it overrides it."""
    return {
        f"{cls.__name__}.{SHARDED_HOOK}()": _overrides_hook(cls)
        for _, cls in _parts(worker_cls)
        if getattr(cls, "sharded_modules", ())
    }


def _overrides_hook(cls: type) -> bool:
    hook = getattr(cls, SHARDED_HOOK, None)
    return hook is not None and getattr(hook, "__qualname__", "") != f"Worker.{SHARDED_HOOK}"


def _parts(worker_cls: type) -> list[tuple[str, type]]:
    """(prefix, class) of the worker class, or of each role of a colocated one (``create_colocated_worker_cls``)."""
    roles = getattr(worker_cls, "_dispatchcore_roles", None)
    if roles:
        return [(f"{role}.", cls) for role, cls in roles.items()]
    return [("", worker_cls)]


def _objects(worker: Any) -> list[tuple[str, Any]]:
    """(prefix, object) of the worker, or of each role object of a colocated one."""
    roles = worker.__dict__.get("_dispatchcore_role_objects")
    if roles:
        return [(f"{role}.", obj) for role, obj in roles.items()]
    return [("", worker)]


def sharded_report(worker: Any) -> ShardedReport:
    """The declared modules and optimizers of the worker (each role of a colocated one), run on its rank."""
    signature: list[tuple[str, str]] = []
    problems: list[str] = []
    for prefix, obj in _objects(worker):
        _report_part(obj, prefix, signature, problems)
    return ShardedReport(tuple(signature), tuple(problems))


def _report_part(worker: Any, prefix: str, signature: list[tuple[str, str]], problems: list[str]) -> None:
    params: set[int] = set()
    for attr in getattr(worker, "sharded_modules", ()):
        module = getattr(worker, attr, None)
        if module is None:
            problems.append(f"sharded_modules names {prefix}{attr}, which this worker does not have")
            continue
        managed: set[int] = set()
        for state in fsdp_states(module):
            where = f"{prefix}{attr}.{state.name}" if state.name else f"{prefix}{attr}"
            signature.append((where, state.sharded))
            managed |= state.registered
            params |= state.owned
            if state.training != "IDLE":
                problems.append(f"{where} was left mid-step (FSDP2 state {state.training})")
            if state.mismatched:
                problems.append(f"{where} says {state.sharded} but holds {state.mismatched} parameters that are not")
        params.update(id(p) for p in module.parameters() if id(p) not in managed)
    for attr in getattr(worker, "sharded_optimizers", ()):
        optimizer = getattr(worker, attr, None)
        if optimizer is None:
            problems.append(f"sharded_optimizers names {prefix}{attr}, which this worker does not have")
            continue
        held = [p for group in optimizer.param_groups for p in group["params"]]
        signature.append((f"{prefix}{attr}", str(len(held))))
        strays = sum(id(p) not in params for p in held)
        if strays:
            problems.append(
                f"{prefix}{attr} holds {strays} of {len(held)} parameters that are not the sharded modules' "
                "current ones (rebuild the optimizer after the model)"
            )


@dataclass(frozen=True)
class FsdpState:
    """One FSDP2 module's state as the check reads it."""

    name: str
    #: ``IDLE`` between steps; ``FORWARD``, ``PRE_BACKWARD``, ``POST_BACKWARD`` mid-step.
    training: str
    #: ``SHARDED``, ``SHARDED_POST_FORWARD`` or ``UNSHARDED`` (the root stays unsharded after a forward).
    sharded: str
    #: Ids of the parameters registered on the modules now, and of the sharded ones FSDP2 owns.
    registered: set[int]
    owned: set[int]
    #: How many registered parameters contradict ``sharded`` (a DTensor while unsharded, or the reverse).
    mismatched: int


def fsdp_states(module: Any) -> list[FsdpState]:
    """Per FSDP2 module under ``module`` (itself included), its :class:`FsdpState`.

    Reads FSDP2's private state (torch 2.13): raises :class:`DispatchError`
    naming the torch version where it moved, never a guess.
    """
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    found = []
    for name, sub in module.named_modules():
        if not isinstance(sub, FSDPModule):
            continue
        try:
            state = sub._get_fsdp_state()
            group = state._fsdp_param_group
            training, sharded, registered, owned = state._training_state.name, "SHARDED", [], set()
            if group is not None:
                training = training if training != "IDLE" else group._training_state.name
                sharded = group._sharded_state.name
                registered = [getattr(p._module_info.module, p._module_info.param_name) for p in group.fsdp_params]
                owned = {id(p.sharded_param) for p in group.fsdp_params}
        except AttributeError as exc:
            raise DispatchError(
                f"the sharded-state check reads FSDP2's private state as torch 2.13 keeps it, and torch "
                f"{torch.__version__} moved it ({exc}); pin torch 2.13 or update dispatchcore/_worker/_sharded.py"
            ) from exc
        wants_dtensor = sharded == "SHARDED"
        mismatched = sum(isinstance(p, DTensor) != wants_dtensor for p in registered)
        found.append(FsdpState(name, training, sharded, {id(p) for p in registered}, owned, mismatched))
    return found


def sharded_state(worker: Any, what: str) -> ShardedReport:
    """``Operation.SHARDED`` on a rank: ``"check"`` reports; ``"recover"`` runs the hooks (:func:`run_hooks`) first."""
    if what == "recover":
        run_hooks(worker)
    return sharded_report(worker)


def run_hooks(worker: Any) -> None:
    """:meth:`Worker.recover_sharded_state` of each part declaring sharded modules and overriding it, in order."""
    for _, obj in _objects(worker):
        if getattr(obj, "sharded_modules", ()) and _overrides_hook(type(obj)):
            getattr(obj, SHARDED_HOOK)()
