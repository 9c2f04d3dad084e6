"""An enum that grows at run time (pickled by member name), and ``Execute``: which ranks run a call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from .._base import DispatchAttributeError, DispatchKeyError, RegistrationError


class _DynamicEnumMeta(type):
    _members: dict[str, Any]

    def __iter__(cls) -> Iterator[Any]:
        return iter(list(cls._members.values()))

    def __len__(cls) -> int:
        return len(cls._members)

    def __getitem__(cls, name: str) -> Any:
        try:
            return cls._members[name]
        except KeyError:
            raise DispatchKeyError(f"{cls.__name__} has no member {name!r}; known: {sorted(cls._members)}") from None

    def __contains__(cls, item: object) -> bool:
        if isinstance(item, str):
            return item in cls._members
        return isinstance(item, cls) and cls._members.get(item.name) is item

    def __getattr__(cls, name: str) -> Any:
        members = cls.__dict__.get("_members", {})
        if name in members:
            return members[name]
        raise DispatchAttributeError(f"{cls.__name__} has no member {name!r}; known: {sorted(members)}")


class _DynamicEnum(metaclass=_DynamicEnumMeta):
    """An enum whose members can be added and removed at run time."""

    _members: dict[str, Any] = {}

    def __init__(self, name: str, value: int) -> None:
        self.name = name
        self.value = value

    def __init_subclass__(cls) -> None:
        cls._members = {}

    @classmethod
    def _add(cls, name: str) -> Any:
        if not isinstance(name, str) or not name.isidentifier():
            raise RegistrationError(f"a {cls.__name__} name must be an identifier, got {name!r}")
        if name in cls._members:
            raise RegistrationError(f"{cls.__name__}.{name} already exists")
        member = cls(name, max((m.value for m in cls._members.values()), default=-1) + 1)
        cls._members[name] = member
        return member

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_member_or_placeholder, (type(self), self.name, self.value))

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.name))


def _member_or_placeholder(cls: Any, name: str, value: int) -> Any:
    """Unpickle a member by name; one this process never registered becomes a stand-in (modes run on the driver)."""
    return cls._members.get(name) or cls(name, value)


class Execute(_DynamicEnum):
    """Which ranks run a call: ``ALL`` or ``RANK_ZERO`` (result unwrapped)."""

    if TYPE_CHECKING:
        ALL: ClassVar[ExecuteAll]
        RANK_ZERO: ClassVar[ExecuteRankZero]


for _name in ("ALL", "RANK_ZERO"):
    Execute._add(_name)


if TYPE_CHECKING:  # ``Execute.ALL`` and ``Execute.RANK_ZERO``, told apart for ``register``'s overloads

    class ExecuteAll(Execute): ...

    class ExecuteRankZero(Execute): ...
