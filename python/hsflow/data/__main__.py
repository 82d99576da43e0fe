# SPDX-License-Identifier: Apache-2.0
"""python -m hsflow.data COMMAND ... (see `python -m hsflow.data --help`)."""
import sys

from .prepare import main

sys.exit(main())
