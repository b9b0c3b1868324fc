#!/usr/bin/env bash
# The main job on a fresh machine: install packages, build, then run the bundled
# model. With no arguments it generates text; `scripts/run.sh serve` starts the
# OpenAI-compatible server on 127.0.0.1:8000 instead; any other arguments are
# passed to `pagoda generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
model=models/pagoda-tiny
if [ ! -f "$model/config.json" ]; then
  echo "run.sh: $model is missing; using the small random fixture model instead" >&2
  exec build/pagoda generate --model tests/fixtures/models/llama_f32 --prompt-ids 1,5,9,42 --max-tokens 16
fi
if [ "${1:-}" = "serve" ]; then
  shift
  exec build/pagoda serve --model "$model" --host 127.0.0.1 --port 8000 "$@"
fi
if [ $# -eq 0 ]; then
  set -- --prompt "It is a truth universally acknowledged, that" --max-tokens 120 --temperature 0.8 --seed 1
fi
exec build/pagoda generate --model "$model" "$@"
