# SPDX-License-Identifier: Apache-2.0
"""python -m hsflow.produce: the hsflow-produce command."""
import sys

from . import main

sys.exit(main())
