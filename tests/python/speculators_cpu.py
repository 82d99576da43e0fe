# SPDX-License-Identifier: Apache-2.0
"""hsflow-speculators-train on a machine without a GPU, for the tests only.

speculators' Trainer assumes an accelerator: it moves the model to
LOCAL_RANK's device, autocasts on that device type and synchronises the
accelerator when it profiles. These three are pointed at the CPU here (the
same three scripts/bench/speculators makes for its CPU smoke run), then the
command runs as it is: python speculators_cpu.py [speculators train flags]."""
import sys

import torch
from speculators.train import trainer as spt

spt.get_local_rank = lambda: "cpu"
torch.accelerator.synchronize = lambda *a, **k: None
_init = spt.Trainer.__init__


def _cpu_init(self, *a, **k):
    _init(self, *a, **k)
    self.device_type = "cpu"


spt.Trainer.__init__ = _cpu_init

from hsflow.integrations.speculators_train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
