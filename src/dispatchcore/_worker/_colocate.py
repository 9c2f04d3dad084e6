"""Several roles (actor, reference, critic...) hosted by one worker per rank.

``create_colocated_worker_cls({"actor": Actor, "ref": Ref})`` builds a class
whose instance holds one object per role and exposes each role's registered
method ``m`` as ``<role>_m``.  ``wg.spawn({"actor", "ref"})`` then gives
per-role groups on the same ranks.  Built in the core, so every executor
gets colocation for free.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from .._base import DispatchAttributeError, DispatchTypeError, DispatchValueError
from .._dispatch import REGISTRATION_ATTR, registered_methods
from ._handover import hands_over
from ._worker import Worker


class ClassWithInitArgs:
    """A worker class with the arguments to build it (verl's ``RayClassWithInitArgs``)."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        if not isinstance(cls, type):
            raise DispatchTypeError(f"ClassWithInitArgs needs a class, got {cls!r}")
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"ClassWithInitArgs({self.cls.__name__})"


def _role_spec(role: str, value: Any) -> ClassWithInitArgs:
    if isinstance(value, ClassWithInitArgs):
        return value
    if isinstance(value, type):
        return ClassWithInitArgs(value)
    inner = getattr(value, "cls", None)  # verl's RayClassWithInitArgs and look-alikes
    if isinstance(inner, type):
        return ClassWithInitArgs(inner, *getattr(value, "args", ()), **getattr(value, "kwargs", {}))
    raise DispatchTypeError(f"role {role!r}: expected a worker class or ClassWithInitArgs, got {value!r}")


def _forward(role: str, method: str, registration: Any) -> Any:
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._dispatchcore_role_objects[role], method)(*args, **kwargs)

    forward.__name__ = f"{role}_{method}"
    forward.__qualname__ = f"Colocated.{role}_{method}"
    setattr(forward, REGISTRATION_ATTR, registration)
    return forward


def create_colocated_worker_cls(class_dict: Mapping[str, Any]) -> type[Worker]:
    """One worker class hosting every role of ``class_dict`` on each rank.

    Values are worker classes or :class:`ClassWithInitArgs`.  The group's
    ``init_kwargs`` may hold a dict per role name, merged over the role's own.
    """
    if not isinstance(class_dict, Mapping) or not class_dict:
        raise DispatchValueError("create_colocated_worker_cls needs a non-empty {role: worker class} mapping")
    specs = {str(role): _role_spec(str(role), value) for role, value in class_dict.items()}
    for role in specs:
        if not role.isidentifier():
            raise DispatchValueError(f"role names become method prefixes and must be identifiers, got {role!r}")

    def __init__(self: Any, **role_kwargs: Any) -> None:
        unknown = sorted(set(role_kwargs) - set(specs))
        if unknown:
            raise DispatchTypeError(f"init_kwargs name unknown role(s) {unknown}; roles are {sorted(specs)}")
        self._dispatchcore_role_objects = {}
        for role, spec in specs.items():
            extra = role_kwargs.get(role) or {}
            self._dispatchcore_role_objects[role] = obj = spec.cls(*spec.args, **{**spec.kwargs, **extra})
            if hasattr(obj, "__dict__"):  # a role reads the host's weights_version (dispatchcore.versioned)
                obj.__dict__["_dispatchcore_colocated_host"] = weakref.ref(self)

    def on_membership_change(self: Any, change: Any) -> None:
        # Every role's hook, in the order the roles were given.
        for role in specs:
            hook = getattr(self._dispatchcore_role_objects[role], "on_membership_change", None)
            if hook is not None:
                hook(change)

    def __getattr__(self: Any, name: str) -> Any:
        # ``"<role>_<name>"`` for any public attribute of a role, not only its @register methods: what
        # the core calls by name on a role (weight sync's ``actor_weights``, ``rollout_load_weights``).
        roles = self.__dict__.get("_dispatchcore_role_objects")
        for role, obj in (roles or {}).items():
            attr = name[len(role) + 1 :]
            if name.startswith(f"{role}_") and attr and not attr.startswith("_"):
                return getattr(obj, attr)
        raise DispatchAttributeError(f"{type(self).__name__} has no attribute {name!r}")

    namespace: dict[str, Any] = {
        **_handover_members(specs),
        "__init__": __init__,
        "__getattr__": __getattr__,
        "on_membership_change": on_membership_change,
        "_dispatchcore_roles": {role: spec.cls for role, spec in specs.items()},
        "__module__": __name__,
    }
    for role, spec in specs.items():
        for method, registration in registered_methods(spec.cls).items():
            namespace[f"{role}_{method}"] = _forward(role, method, registration)
    name = "Colocated_" + "_".join(specs)
    cls = type(name, (Worker,), namespace)
    return cls


def _handover_members(specs: Mapping[str, ClassWithInitArgs]) -> dict[str, Any]:
    """The roles' state hand-overs as one: ``"<role>.<name>"`` tensors (``docs/replacing-ranks.md``)."""
    roles = [role for role, spec in specs.items() if hands_over(spec.cls)]
    if not roles:
        return {}
    kinds = {specs[role].cls.replicas for role in roles}  # type: ignore[attr-defined]

    def replica_state(self: Any) -> dict[str, Any]:
        objects = self._dispatchcore_role_objects
        return {f"{r}.{k}": v for r in roles for k, v in (objects[r].replica_state() or {}).items()}

    def load_replica_state(self: Any, state: dict[str, Any]) -> None:
        for role in roles:
            prefix = f"{role}."
            part = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            self._dispatchcore_role_objects[role].load_replica_state(part)

    return {
        "replica_state": replica_state,
        "load_replica_state": load_replica_state,
        "replicas": kinds.pop() if len(kinds) == 1 else None,
    }


#: Short alias of :func:`create_colocated_worker_cls`.
colocate = create_colocated_worker_cls
