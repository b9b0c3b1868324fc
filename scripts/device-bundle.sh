#!/usr/bin/env bash
# Packs binaries built here into a folder that runs on the GPU machine, which
# has the NVIDIA driver and CUDA runtime but none of Debian's libraries: every
# shared library a binary needs, other than glibc's, the driver's and CUDA's own,
# is copied beside it, and run.sh sets LD_LIBRARY_PATH.
#
# Usage: scripts/device-bundle.sh OUT_DIR BINARY...
#   e.g. scripts/device-bundle.sh .device/bundle build/pagoda build/tests/kernels/gpu_tests
# Then on the GPU machine: OUT_DIR/run.sh pagoda --version
set -euo pipefail
out=$1; shift
mkdir -p "$out/bin" "$out/lib"
# Libraries the GPU machine provides itself (glibc, the driver, CUDA 13's toolkit libraries).
system_re='^(linux-vdso|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|ld-linux|libcuda\.so|libnvidia|libgcc_s\.so|libcublas|libcudart|libnccl|libcudnn|libcurand)'
here=$(cd "$(dirname "$0")" && pwd)
for bin in "$@"; do
  # Refuse a binary that links an object compiled from an input edited during its compile
  # (ninja < 1.12 keeps such an object: scripts/stale_objects.py).
  dir=$(cd "$(dirname "$bin")" && pwd)
  while [ "$dir" != / ] && [ ! -f "$dir/build.ninja" ]; do dir=$(dirname "$dir"); done
  if [ -f "$dir/build.ninja" ] && command -v python3 >/dev/null; then
    bin_abs=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
    python3 "$here/stale_objects.py" "$dir" "${bin_abs#"$dir"/}" ||
      { echo "device-bundle: $bin links stale objects (above); rebuild them first" >&2; exit 1; }
  fi
  cp -L "$bin" "$out/bin/"
  ldd "$bin" | awk '/=>/ {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $system_re ]] && continue
    [ -f "$path" ] || continue
    cp -Ln "$path" "$out/lib/" 2>/dev/null || true
  done
done
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs a bundled binary with its libraries: run.sh NAME [ARGS...]
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
name=$1; shift
exec "$here/bin/$name" "$@"
RUN
chmod +x "$out/run.sh"
du -sh "$out" | awk '{print "device-bundle: " $1 " in " "'"$out"'"}'
