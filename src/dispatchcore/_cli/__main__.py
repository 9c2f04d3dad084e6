"""``python -m dispatchcore._cli`` (the console script's module form)."""

import sys

from . import main

sys.exit(main())
