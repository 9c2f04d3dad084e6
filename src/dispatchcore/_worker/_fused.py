"""Fused workers: several roles as attributes of one worker that has methods of its own (verl's FusedWorker).

``create_colocated_worker_raw_cls({"actor": Actor, "critic": Critic})``
returns a :class:`~dispatchcore.Worker` subclass meant to be subclassed: each
instance builds one object per role, reachable as ``self.actor``,
``self.critic`` and ``self.fused_worker_dict`` (every role object sees the
same dict, so roles can reach each other).  The subclass's own ``@register``
methods combine roles inside one call, without a round trip per role::

    class Hybrid(create_colocated_worker_raw_cls(roles)):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def step(self, x):
            return self.critic.sub(self.actor.add(x))

A group of such a class offers per-role groups on the same ranks with
``wg.spawn(roles)`` on every backend (``RayWorkerGroup.fuse(roles)`` also
sets them as ``wg.actor`` ...): their calls reach the role object through
role-prefixed forwarding methods, as for
:func:`~dispatchcore.create_colocated_worker_cls`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._base import DispatchValueError
from .._dispatch import registered_methods
from ._colocate import ClassWithInitArgs, _role_spec
from ._worker import Worker

#: What verl prefixes a fused class's name with (``FusedWorker_actor_critic``).
FUSED_CLASS_PREFIX = "FusedWorker"
#: verl's separator in ``_fuw_execute("<role>_fwmn_<method>")``.
FUSED_METHOD_SEPARATOR = "_fwmn_"


def _role_method(role: str, method: str) -> Any:
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.fused_worker_dict[role], method)(*args, **kwargs)

    forward.__name__ = f"{role}_{method}"
    forward.__qualname__ = f"{FUSED_CLASS_PREFIX}.{role}_{method}"
    return forward


def _check_roles(specs: Mapping[str, ClassWithInitArgs]) -> None:
    taken = set(dir(Worker))
    for role in specs:
        if not role.isidentifier():
            raise DispatchValueError(f"role names become attributes and method prefixes; {role!r} is not an identifier")
        if role in taken or role.startswith("_"):
            raise DispatchValueError(
                f"role name {role!r} would hide Worker.{role}" if role in taken else f"role name {role!r} is private"
            )


def create_colocated_worker_raw_cls(class_dict: Mapping[str, Any]) -> type[Worker]:
    """A worker class to subclass, hosting one object per role of ``class_dict`` (verl's name).

    Values are worker classes (``ray.remote`` ones too) or
    :class:`~dispatchcore.ClassWithInitArgs` (verl's ``RayClassWithInitArgs``).
    """
    if not isinstance(class_dict, Mapping) or not class_dict:
        raise DispatchValueError("create_colocated_worker_raw_cls needs a non-empty {role: worker class} mapping")
    specs = {str(role): _role_spec(str(role), value) for role, value in class_dict.items()}
    _check_roles(specs)

    def __init__(self: Any) -> None:
        roles: dict[str, Any] = {}
        for role, spec in specs.items():
            roles[role] = spec.cls(*spec.args, **spec.kwargs)
        self.fused_worker_dict = roles
        for role, obj in roles.items():
            setattr(self, role, obj)
            obj.fused_worker_dict = roles

    def _fuw_execute(self: Any, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """verl's entry point: ``method_name`` is ``"<role>_fwmn_<method>"``."""
        role, separator, method = method_name.partition(FUSED_METHOD_SEPARATOR)
        if not separator or role not in self.fused_worker_dict:
            raise DispatchValueError(
                f"_fuw_execute({method_name!r}): expected '<role>{FUSED_METHOD_SEPARATOR}<method>' with a role "
                f"of {sorted(self.fused_worker_dict)}"
            )
        return getattr(self.fused_worker_dict[role], method)(*args, **kwargs)

    def on_membership_change(self: Any, change: Any) -> None:
        # Every role's hook, in the order the roles were given.
        for obj in self.fused_worker_dict.values():
            hook = getattr(obj, "on_membership_change", None)
            if hook is not None:
                hook(change)

    namespace: dict[str, Any] = {
        "__init__": __init__,
        "__module__": __name__,
        "_fuw_execute": _fuw_execute,
        "on_membership_change": on_membership_change,
        "_dispatchcore_roles": {role: spec.cls for role, spec in specs.items()},
        "raw_cls_dict": {role: spec.cls for role, spec in specs.items()},
        "is_fused_worker": True,
    }
    for role, spec in specs.items():
        for method in registered_methods(spec.cls):
            namespace[f"{role}_{method}"] = _role_method(role, method)
    name = "_".join([FUSED_CLASS_PREFIX, *specs])
    return type(name, (Worker,), namespace)
