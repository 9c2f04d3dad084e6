"""Which backend a group runs on, and configs (any mapping, OmegaConf's included) read as plain values."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

BACKEND_ENV = "DISPATCHCORE_BACKEND"
DEFAULT_BACKEND = "local"


def resolve_backend(backend: str | None, config: Mapping[str, Any] | None = None) -> str:
    """Backend choice, first set wins: argument, config, environment, ``local``."""
    if backend:
        return backend
    if config is not None and config.get("backend"):
        return str(config["backend"])
    return os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND


def plain_config(value: Any) -> Any:
    """Plain dicts and lists from any mapping or sequence (OmegaConf's containers included)."""
    if isinstance(value, Mapping) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        return {str(k): plain_config(value[k]) for k in value.keys()}
    if isinstance(value, (list, tuple)) or (isinstance(value, Sequence) and not isinstance(value, (str, bytes))):
        return [plain_config(v) for v in value]
    return value
