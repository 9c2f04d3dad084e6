"""Testing kit: test your workers, your dispatch modes and your driver without GPUs or clusters.

Submodules: ``strategies`` (Hypothesis), ``modes`` (``check_dispatch_mode``), ``faults``
(``backend="faulty"``), ``mock`` (``backend="mock"``), ``pytest_plugin`` (``make_group``) and
``conformance`` (``ExecutorConformance``, which a third-party executor subclasses); see
docs/testing.md.

Names load on first use: importing this package needs neither Hypothesis nor
pytest (the ``faulty`` backend's entry point imports it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dispatchcore import DispatchAttributeError

if TYPE_CHECKING:
    from .assertions import assert_dataproto_equal
    from .faults import Fault, FaultyExecutor, FiredFault, InjectedFault
    from .mock import MockExecutor
    from .modes import ModePropertyError, assert_mode_properties, check_dispatch_mode
    from .strategies import (
        ALL_DTYPES,
        dataprotos,
        meta_infos,
        nd_meshes,
        non_tensor_columns,
        tensor_dtypes,
        trailing_shapes,
        world_sizes,
    )

#: Where the names live, cheapest first: only ``modes`` and ``strategies`` need Hypothesis.
_MODULES = ("assertions", "faults", "mock", "modes", "strategies")

__all__ = [
    "ALL_DTYPES",
    "Fault",
    "FaultyExecutor",
    "FiredFault",
    "InjectedFault",
    "MockExecutor",
    "ModePropertyError",
    "assert_dataproto_equal",
    "assert_mode_properties",
    "check_dispatch_mode",
    "dataprotos",
    "meta_infos",
    "nd_meshes",
    "non_tensor_columns",
    "tensor_dtypes",
    "trailing_shapes",
    "world_sizes",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise DispatchAttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module in _MODULES:
        found = importlib.import_module(f"{__name__}.{module}")
        if name in found.__all__:
            break
    value = getattr(found, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
