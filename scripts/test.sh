#!/usr/bin/env bash
# Sets everything up (idempotent) and runs the whole test suite.
#
# With no arguments, in two phases: first every test that starts no vLLM engine, on
# TRIAGE_TEST_WORKERS pytest-xdist workers (default 2; each test file stays on one worker,
# so a file's fixtures are made once); then the engine tests (marker `engine`) one at a
# time, since each starts real engines that use every core. Both phases always run; the
# script fails if either does. With arguments, one plain pytest run with them.
set -euo pipefail
cd "$(dirname "$0")/.."
TRIAGE_SETUP_BROWSER=1 bash scripts/setup.sh
export HF_HUB_OFFLINE=1

run_pytest() {
  local rc=0
  .venv/bin/python -m pytest "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests (exit 5)"
    rc=0
  fi
  return "$rc"
}

if [ "$#" -gt 0 ]; then
  run_pytest "$@"
  exit $?
fi
rc=0
workers=${TRIAGE_TEST_WORKERS:-2}
echo "[test] phase 1 of 2: the tests that start no vLLM engine, $workers workers"
run_pytest -m "not engine" -n "$workers" --dist loadfile || rc=$?
echo "[test] phase 2 of 2: the engine tests, one at a time"
run_pytest -m engine || rc=$?
exit "$rc"
