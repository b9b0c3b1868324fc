# Sourced by the small tools/gpu/*_call.sh scripts that carry their own bundle in .device/<name>:
#   call_bundle_pack SCRIPT BIN...   (here) DEST (required): BINs through scripts/device-bundle.sh, stripped,
#                                    the commit, as DEST/bundle.tar.xz, with SCRIPT and this file beside it;
#   call_bundle_unpack               (on the GPU machine) unpacks the bundle beside the sourcing script once,
#                                    exports PAGODA_SOURCE_DIR, sets B (the bundle's run.sh) and out ($OUT or
#                                    /tmp/<script name>), and enters the tree;
#   call_gtest LABEL SECONDS BIN [ARGS...]   (on the GPU machine, after unpack) runs a bundled test binary
#                                    into $out/LABEL.log and prints its exit code, gtest's PASSED / FAILED
#                                    lines and its first failures;
#   call_serve LABEL MODEL [ARGS...] (on the GPU machine, after unpack) starts the bundled `pagoda serve` on
#                                    random weights of MODEL's config, on a loopback port the kernel picks,
#                                    logging to $out/serve_LABEL.log; waits until /health answers (150 s at
#                                    most) and sets port and pid.
call_bundle_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

call_bundle_pack() {
  local script=$1; shift
  local root dest
  root=$(cd "$call_bundle_here/../.." && pwd); dest=${DEST:?DEST=/work/main/.device/NAME}
  rm -rf "$dest" && mkdir -p "$dest"
  "$root/scripts/device-bundle.sh" "$dest/bundle" "$@" >/dev/null || return 1
  strip "$dest"/bundle/bin/* 2>/dev/null || true
  git -C "$root" rev-parse --short HEAD > "$dest/bundle/commit"
  # A dictionary larger than the bundle lets xz store the binaries' shared kernel images once
  # (six test binaries: ~14 MB instead of ~35 MB with tar's default), inside the carry limit.
  tar cf - -C "$dest" bundle | xz -T2 --lzma2=preset=6,dict=192MiB > "$dest/bundle.tar.xz" && rm -rf "$dest/bundle"
  cp "$script" "${BASH_SOURCE[0]}" "$dest/" && du -sh "$dest"
}

call_bundle_unpack() {
  local dir root
  dir=$(cd "$(dirname "$0")" && pwd); root=$(cd "$dir/../.." && pwd)
  [ -x "$dir/bundle/run.sh" ] || tar xJf "$dir/bundle.tar.xz" -C "$dir"
  export PAGODA_SOURCE_DIR=$root
  B=$dir/bundle/run.sh
  out=${OUT:-/tmp/$(basename "$0" .sh)}; mkdir -p "$out"
  cd "$root" || return 1
}

call_gtest() {
  local label=$1 limit=$2; shift 2
  timeout "$limit" "$B" "$@" > "$out/$label.log" 2>&1
  echo "$label rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/$label.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Which is|differ" "$out/$label.log" | head -10
}

call_serve() {
  local label=$1 model=$2 t1=$SECONDS; shift 2
  "$B" pagoda serve --model "$model" --load-format random --device cuda --host 127.0.0.1 --port 0 \
    --max-queued 1024 "$@" > "$out/serve_$label.log" 2>&1 &
  pid=$!; port=""
  for _ in $(seq 1 150); do
    port=$(grep -oP 'listening on http://[0-9.]+:\K[0-9]+' "$out/serve_$label.log" | head -1)
    [ -n "$port" ] && python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
    sleep 1
  done
  echo "== serve $label up after $((SECONDS - t1)) s (port ${port:-none})"
}
