#!/usr/bin/env bash
# Installs the official `openai` npm package (v6) into the git-ignored
# .cache/node/ of the repo, once; later runs find it there and do nothing.
# Called by the e2e tests; safe to run by hand.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="$root/.cache/node"
if [ -f "$dir/node_modules/openai/package.json" ]; then
  exit 0
fi
mkdir -p "$dir"
cd "$dir"
[ -f package.json ] || echo '{"name":"pagoda-e2e-client","private":true}' > package.json
npm install --no-audit --no-fund --silent openai@6 >/dev/null
test -f node_modules/openai/package.json
