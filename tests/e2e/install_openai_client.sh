#!/usr/bin/env bash
# Installs the official `openai` npm package (v6) into the git-ignored
# .cache/node/ of the repo, once; later runs find it there and do nothing.
# Called by the e2e tests; safe to run by hand.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="$root/.cache/node"
mkdir -p "$dir"
# Tests may call this concurrently: one npm install at a time, and a half-written
# install (seen when two ran at once) is removed and redone.
exec 9>"$dir/.install.lock"
flock 9
if [ -f "$dir/node_modules/openai/package.json" ]; then
  exit 0
fi
cd "$dir"
rm -rf node_modules package-lock.json
[ -f package.json ] || echo '{"name":"pagoda-e2e-client","private":true}' > package.json
npm install --no-audit --no-fund --silent openai@6 >/dev/null
test -f node_modules/openai/package.json
