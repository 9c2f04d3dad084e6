"""Test-run setup for this example.

pytest puts this folder on ``sys.path`` (its default import mode does so for
a conftest's folder), so the tests import the user's modules as a project's
tests would.  Process backends start ranks that do not have this folder on
their path (Ray actors), so the modules travel by value instead: cloudpickle
ships their classes and functions with the worker class.  An installed
package needs neither.
"""

from __future__ import annotations

import balanced_mode
import cloudpickle
import policy_worker
import train_loop

for module in (balanced_mode, policy_worker, train_loop):
    cloudpickle.register_pickle_by_value(module)
