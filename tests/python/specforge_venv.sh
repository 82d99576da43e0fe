#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs test_specforge.py (hsflow.integrations.specforge against
# SpecForge 0.2 itself) in the venv scripts/install-specforge-venv makes,
# since SpecForge pins a torch and transformers older than the main
# environment's. Exit 77 (skipped, with the reason) when that venv is absent;
# a venv that is there but cannot import SpecForge is a failure.
#   HS_SPECFORGE_VENV  the venv (default <repo>/.venv-specforge)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${HS_SPECFORGE_VENV:-$root/.venv-specforge}
if [ ! -x "$venv/bin/python" ]; then
  echo "test_specforge: skipped: no venv at $venv; scripts/install-specforge-venv creates it"
  exit 77
fi
if ! "$venv/bin/python" -c "import specforge.algorithms.common.dflash_family_model, torch, transformers, pytest, numpy"; then
  echo "test_specforge: $venv does not import specforge, torch, transformers, pytest and" \
       "numpy; remove it and run scripts/install-specforge-venv again" >&2
  exit 1
fi
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -o console_output_style=classic \
  "$here/test_specforge.py" "$@"
