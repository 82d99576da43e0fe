#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs test_speculators.py, or the test file given first (test_speculators_*.py),
# (hsflow.integrations.speculators and the store's export against
# speculators 0.9 itself) in the venv scripts/install-speculators-venv makes,
# since speculators pins a torch and transformers older than the main
# environment's. Exit 77 (skipped, with the reason) when that venv is absent;
# a venv that is there but cannot import speculators is a failure.
#   HS_SPECULATORS_VENV  the venv (default <repo>/.venv-speculators)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${HS_SPECULATORS_VENV:-$root/.venv-speculators}
if [ ! -x "$venv/bin/python" ]; then
  echo "test_speculators: skipped: no venv at $venv; scripts/install-speculators-venv creates it"
  exit 77
fi
if ! "$venv/bin/python" -c "import speculators, torch, transformers, pytest, numpy"; then
  echo "test_speculators: $venv does not import speculators, torch, transformers, pytest and" \
       "numpy; remove it and run scripts/install-speculators-venv again" >&2
  exit 1
fi
file=test_speculators.py
case "${1:-}" in test_speculators*.py) file=$1; shift ;; esac
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -o console_output_style=classic \
  "$here/$file" "$@"
