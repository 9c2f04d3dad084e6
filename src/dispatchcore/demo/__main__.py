"""``python -m dispatchcore.demo`` (also under ``torchrun ... -m dispatchcore.demo``)."""

import sys

from .loop import main

if __name__ == "__main__":
    sys.exit(main())
