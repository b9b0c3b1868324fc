// Read throughput of the KV tiers below the host, per block size: writes N
// blocks through a tier's writer thread, waits for them, then reads them
// back as runs of `run` blocks (read_prefix, checksum verified) and prints a
// markdown table of GB/s (payload bytes / wall time). Disk reads come from
// the page cache unless the caller drops it between the phases (--pause).
//
//   pagoda_bench_kv_tiers --disk DIR [--redis redis://127.0.0.1:6379] [--total-mib 256] [--run 64]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "pagoda/kvstore/disk_tier.h"
#include "pagoda/kvstore/redis_tier.h"

namespace {

using namespace pagoda;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct Result {
  double write_gbs = 0, read_gbs = 0;
  int64_t blocks_read = 0;
};

Result measure(kvstore::BlockStore& tier, size_t block_bytes, int64_t total_bytes, int32_t run) {
  const int64_t n = std::max<int64_t>(run, total_bytes / static_cast<int64_t>(block_bytes));
  std::vector<kv::StableKey> keys;
  const kv::StableKey root = kv::stable_namespace_root("bench", std::to_string(block_bytes));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t token = static_cast<int32_t>(i);
    keys.push_back(kv::stable_block_key(root, &token, 1));
  }
  std::vector<std::byte> block(block_bytes);
  for (size_t j = 0; j < block_bytes; ++j) block[j] = static_cast<std::byte>(j * 131);
  Result r;
  auto t = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    tier.write_async(keys[static_cast<size_t>(i)], block);
    if (i % 256 == 255) tier.flush();  // stay under the queue bound: nothing dropped
  }
  tier.flush();
  r.write_gbs = static_cast<double>(n) * static_cast<double>(block_bytes) / seconds_since(t) / 1e9;
  std::vector<std::byte> out(static_cast<size_t>(run) * block_bytes);
  t = std::chrono::steady_clock::now();
  for (int64_t i = 0; i + run <= n; i += run)
    r.blocks_read += tier.read_prefix(std::span(keys).subspan(static_cast<size_t>(i), static_cast<size_t>(run)), out);
  r.read_gbs = static_cast<double>(r.blocks_read) * static_cast<double>(block_bytes) / seconds_since(t) / 1e9;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string disk_dir, redis_url;
  int64_t total_mib = 256;
  int32_t run = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--disk") disk_dir = argv[i + 1];
    else if (flag == "--redis") redis_url = argv[i + 1];
    else if (flag == "--total-mib") total_mib = std::atoll(argv[i + 1]);
    else if (flag == "--run") run = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const int64_t total = total_mib << 20;
  std::printf("| tier | block bytes | blocks | run | write GB/s | read GB/s |\n|---|---:|---:|---:|---:|---:|\n");
  for (size_t block_bytes : {size_t{16} << 10, size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{4} << 20}) {
    if (!disk_dir.empty()) {
      const std::filesystem::path dir = std::filesystem::path(disk_dir) / std::to_string(block_bytes);
      std::filesystem::remove_all(dir);
      auto tier = kvstore::DiskTier::open({.dir = dir, .capacity_bytes = 2 * total + (int64_t{64} << 20),
                                           .block_bytes = block_bytes});
      if (!tier.ok()) {
        std::fprintf(stderr, "%s\n", tier.status().to_string().c_str());
        return 1;
      }
      const Result r = measure(**tier, block_bytes, total, run);
      std::printf("| disk | %zu | %lld | %d | %.2f | %.2f |\n", block_bytes, static_cast<long long>(r.blocks_read), run,
                  r.write_gbs, r.read_gbs);
      tier->reset();
      std::filesystem::remove_all(dir);
    }
    if (!redis_url.empty()) {
      auto endpoint = kvstore::parse_redis_url(redis_url);
      if (!endpoint.ok()) return 1;
      auto tier = kvstore::RedisTier::open({.endpoint = *endpoint, .block_bytes = block_bytes,
                                            .timeout = std::chrono::milliseconds(5000)});
      if (!tier.ok()) {
        std::fprintf(stderr, "%s\n", tier.status().to_string().c_str());
        return 1;
      }
      const Result r = measure(**tier, block_bytes, total, run);
      std::printf("| redis | %zu | %lld | %d | %.2f | %.2f |\n", block_bytes, static_cast<long long>(r.blocks_read),
                  run, r.write_gbs, r.read_gbs);
    }
    std::fflush(stdout);
  }
  return 0;
}
