# SPDX-License-Identifier: Apache-2.0
"""The transformers engine's worker, under the name it had before the
producer's engines became the package hsflow.produce."""
from .produce.transformers import *  # noqa: F401,F403
from .produce.transformers import (REFUSED_STATUS, SelfCheckError, Worker,  # noqa: F401
                                   _fault, _is_oom, late_busy_pct, profile_first_batch,
                                   worker_main)
