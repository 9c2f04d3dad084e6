"""``python -m dispatchcore.demo`` (also under ``torchrun ... -m dispatchcore.demo``)."""

from __future__ import annotations

import sys

from .loop import main

if __name__ == "__main__":
    sys.exit(main())
