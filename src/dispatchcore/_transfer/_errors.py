"""The errors a weight transfer raises for what the user gave it (an offer it cannot take, a failed check).

Raised on the driver: a rank that refuses an offer raises one of these,
and the driver raises the same class again naming the group and rank.

    DispatchError
    ├── DispatchValueError
    │   └── WeightOfferError        an offer the plan cannot take (placement, rows no source holds)
    │       └── WeightTypeError     ... because the value is no tensor, or a tensor subclass (also TypeError)
    └── WeightMismatchError         verify(): a destination holds other bytes than the sources (RuntimeError)
"""

from __future__ import annotations

from .._base import DispatchError, DispatchTypeError, DispatchValueError


class WeightOfferError(DispatchValueError):
    """A source's offer cannot be sent as it is (named by parameter); refused before anything moves."""


class WeightTypeError(WeightOfferError, DispatchTypeError):
    """An offered value is not a tensor the transfer can read (a tensor subclass other than ``DTensor``)."""


class WeightMismatchError(DispatchError, RuntimeError):
    """``WeightSync.verify`` found destinations whose weights differ from the sources' (named by parameter and rank).

    ``mismatches`` lists ``(name, rank, detail)``: the destination rank
    (``-1`` where source ranks disagree among themselves).
    """

    def __init__(self, message: str, mismatches: tuple[tuple[str, int, str], ...] = ()) -> None:
        super().__init__(message)
        self.mismatches = mismatches

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.mismatches))


#: The classes a rank's refusal is raised again as on the driver, by the name ``RemoteFailure`` carries.
BY_NAME: dict[str, type[WeightOfferError]] = {c.__qualname__: c for c in (WeightOfferError, WeightTypeError)}
