#!/usr/bin/env bash
# One command for a fresh machine: set up, then run the main job on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m socllm run "$@"
