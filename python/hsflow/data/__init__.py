# SPDX-License-Identifier: Apache-2.0
"""hsflow.data: turn training data as people have it into hsflow's token files.

    python -m hsflow.data prepare chat.jsonl train.hst --tokenizer /models/target
    hsflow-data prepare chat.jsonl train.hst --tokenizer /models/target   # the same

Conversations (ShareGPT, OpenAI messages), plain text and pre-tokenised
records become sequences of input_ids with a loss mask that covers the
assistant tokens only, rendered with the target's own chat template; see
prepare.py and docs/data.md. hst.py writes and reads the .hst format.
"""
from .hst import HstWriter, read_hst
from .prepare import PrepareOptions, main, prepare

__all__ = ["prepare", "PrepareOptions", "main", "HstWriter", "read_hst"]
