#!/usr/bin/env bash
# Installs every Debian package that pagoda's build, tests and benchmarks need.
# Safe to run again: apt skips what is already there. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  nlohmann-json3-dev        # JSON (config.json, tokenizer.json, OpenAI API)
  libpcre2-dev              # tokenizer pre-tokenizer regexes (JIT, Unicode)
  libutf8proc-dev           # Unicode normalisation (NFC/NFKC) for tokenizers
  libcli11-dev              # command line
  libfmt-dev libspdlog-dev  # formatting and logging
  libcpp-httplib-dev        # HTTP client in tests and `pagoda bench serve`
  libboost1.81-dev          # HTTP server front: Boost.Asio + Boost.Beast (header-only)
  clang libclang-rt-14-dev  # libFuzzer targets and ASan/UBSan runtimes (scripts/fuzz.sh)
  libssl-dev                # SHA-256 block hashes (stable KV block keys)
  libxxhash-dev             # checksums of KV blocks on disk and in redis (XXH3)
  libhiredis-dev            # the redis KV tier
  redis-server              # tests of the redis KV tier start their own on loopback
  libjemalloc-dev           # malloc of the pagoda binary and the engine benches (CMakeLists.txt)
  libgtest-dev libgmock-dev # unit tests
  libbenchmark-dev          # micro benchmarks
  libopenblas-dev           # CPU GEMM
  nodejs                    # openai client for e2e tests; tokenizer.json packages
  gnuplot-nox               # benchmark plots
  python3                   # fixture checks and small tools
  json-schema-test-suite    # the official JSON Schema tests, for pagoda's validator
  r-cran-janeaustenr bible-kjv-text  # public-domain training / eval text
)

missing=()
# nodesource nodejs ships its own npm and conflicts with Debian's npm package.
command -v npm >/dev/null 2>&1 || packages+=(npm)
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
