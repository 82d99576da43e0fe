#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs one test file in the venv scripts/install-engine-venv makes
# (.venv-engines: vLLM and speculators 0.9, whose pinned torch and
# transformers differ from the main environment's):
#   engine_venv.sh TEST_FILE MODULE...   e.g. test_vllm.py vllm
# Exit 77 (skipped, with the reason) when that venv is absent or was made
# without one of the MODULEs (HS_ENGINE_VLLM=0 leaves vLLM out); a venv
# that is there but cannot import torch, transformers, pytest and numpy is a
# failure.
#   HS_ENGINE_VENV  the venv (default <repo>/.venv-engines)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
test=$1
shift
name=$(basename "$test" .py)
venv=${HS_ENGINE_VENV:-$root/.venv-engines}
if [ ! -x "$venv/bin/python" ]; then
  echo "$name: skipped: no venv at $venv; scripts/install-engine-venv creates it"
  exit 77
fi
if ! "$venv/bin/python" -c "import torch, transformers, pytest, numpy"; then
  echo "$name: $venv does not import torch, transformers, pytest and numpy; remove it and" \
       "run scripts/install-engine-venv again" >&2
  exit 1
fi
for m in "$@"; do
  if ! "$venv/bin/python" -c "import $m" 2>/dev/null; then
    echo "$name: skipped: $venv has no $m; scripts/install-engine-venv installs it"
    exit 77
  fi
done
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -o console_output_style=classic \
  "$here/$test"
