#!/usr/bin/env bash
# Sets everything up (idempotent) and runs the whole test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
TRIAGE_SETUP_BROWSER=1 bash scripts/setup.sh
export HF_HUB_OFFLINE=1
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests (exit 5)"
  exit 0
fi
exit "$rc"
