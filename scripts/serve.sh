#!/usr/bin/env bash
# README command 1: install what is needed (once) and serve the embedded default model.
# Extra arguments go to `nextguard serve` (e.g. --port 8000 --model <hf id or folder>).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh guard suites
exec .venv/bin/nextguard serve "$@"
