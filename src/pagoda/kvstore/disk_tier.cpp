#include "pagoda/kvstore/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include "pagoda/kvstore/block_record.h"

namespace pagoda::kvstore {
namespace fs = std::filesystem;
namespace {

constexpr char kIndexMagic[8] = {'P', 'G', 'K', 'V', 'I', 'D', 'X', '1'};
constexpr size_t kIndexEntryBytes = 32 + 8;

// Reads a whole file; false if it cannot be opened or read.
bool read_file(const fs::path& path, std::vector<std::byte>& out, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0 && st.st_size >= 0 && static_cast<size_t>(st.st_size) <= max_bytes;
  if (ok) {
    out.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (ok && done < out.size()) {
      const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
      if (n <= 0) ok = false;
      else done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  return ok;
}

// Reads a record file of exactly header.size() + payload.size() bytes: the
// header into `header`, the payload into `payload` (one preadv, no copy);
// false if it cannot be opened or read or has another size.
bool read_record_split(const fs::path& path, std::span<std::byte> header, std::span<std::byte> payload) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  const size_t total = header.size() + payload.size();
  bool ok = ::fstat(fd, &st) == 0 && st.st_size >= 0 && static_cast<size_t>(st.st_size) == total;
  size_t done = 0;
  while (ok && done < total) {
    std::array<iovec, 2> iov{};
    int count = 0;
    if (done < header.size()) iov[count++] = iovec{header.data() + done, header.size() - done};
    const size_t into_payload = done > header.size() ? done - header.size() : 0;
    iov[count++] = iovec{payload.data() + into_payload, payload.size() - into_payload};
    const ssize_t got = ::preadv(fd, iov.data(), count, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) ok = false;
    else done += static_cast<size_t>(got);
  }
  ::close(fd);
  return ok;
}

// Writes all of `data` to a new file; the errno of the first failure, or 0.
int write_new_file(const fs::path& path, std::span<const std::byte> data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  size_t done = 0;
  int err = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (n == 0) {
      err = ENOSPC;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  return err;
}

bool parse_hex_key(std::string_view hex, kv::StableKey& key) {
  if (hex.size() != 64) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < 32; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    key.bytes[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

void put_u64(std::vector<std::byte>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}
uint64_t get_u64(const std::byte* at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(std::to_integer<uint8_t>(at[i])) << (8 * i);
  return v;
}

std::string format_bytes_short(int64_t b) {
  if (b >= (int64_t{1} << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(b) / (1 << 30));
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{} KiB", b >> 10);
}

}  // namespace

DiskTier::DiskTier(const DiskTierOptions& options) : options_(options), blocks_dir_(options.dir / "blocks") {
  stats_.enabled = true;
  stats_.capacity_bytes = options.capacity_bytes;
}

StatusOr<std::unique_ptr<DiskTier>> DiskTier::open(const DiskTierOptions& options) {
  if (options.dir.empty()) return invalid_argument_error("--kv-offload-disk: empty directory");
  if (options.block_bytes == 0) return invalid_argument_error("disk KV tier: block size in bytes is 0");
  const int64_t record = static_cast<int64_t>(kRecordHeaderBytes + options.block_bytes);
  if (options.capacity_bytes < record)
    return invalid_argument_error("--kv-offload-disk-size {}: smaller than one block record ({} bytes)",
                                  options.capacity_bytes, record);
  if (options.max_queued_writes < 1)
    return invalid_argument_error("disk KV tier: max_queued_writes must be >= 1, got {}", options.max_queued_writes);
  std::unique_ptr<DiskTier> tier(new DiskTier(options));
  PAGODA_RETURN_IF_ERROR(tier->lock_and_load());
  tier->writer_ = std::thread([t = tier.get()] { t->writer_loop(); });
  return tier;
}

Status DiskTier::lock_and_load() {
  const fs::path& dir = options_.dir;
  std::error_code ec;
  fs::create_directories(blocks_dir_, ec);
  if (ec) return io_error("--kv-offload-disk {}: cannot create the directory: {}", dir.string(), ec.message());
  const fs::path lock_path = dir / "LOCK";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0)
    return io_error("--kv-offload-disk {}: cannot write there ({}: {})", dir.string(), lock_path.string(),
                    std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(lock_fd_);
    lock_fd_ = -1;
    if (err == EWOULDBLOCK)
      return failed_precondition_error("--kv-offload-disk {}: in use by another pagoda process (it holds {}); "
                                       "give each server its own directory",
                                       dir.string(), lock_path.string());
    return io_error("--kv-offload-disk {}: cannot lock {}: {}", dir.string(), lock_path.string(), std::strerror(err));
  }
  // A probe write: a read-only directory must fail now, not on the first spill.
  const fs::path probe = dir / ".write-probe";
  if (const int err = write_new_file(probe, std::span<const std::byte>()); err != 0)
    return io_error("--kv-offload-disk {}: cannot write there: {}", dir.string(), std::strerror(err));
  fs::remove(probe, ec);
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(lock_fd_, 0) == 0 && ::pwrite(lock_fd_, pid.data(), pid.size(), 0) < 0) {
    // The pid is informational only.
  }
  std::lock_guard lock(mutex_);
  if (load_index()) {
    opened_from_ = "index";
  } else {
    rebuild_index();
    opened_from_ = "scan";
  }
  fs::remove(dir / "index", ec);  // it describes a clean close only; a crash must rebuild
  // A smaller bound than last time: evict down to it.
  while (stats_.stored_bytes > options_.capacity_bytes && !lru_.empty()) {
    const kv::StableKey victim = lru_.back();
    fs::remove(block_path(victim), ec);
    remove_entry_locked(victim);
    ++stats_.blocks_evicted;
  }
  return ok_status();
}

fs::path DiskTier::block_path(const kv::StableKey& key) const {
  return blocks_dir_ / (kv::stable_key_hex(key) + ".kvb");
}

bool DiskTier::load_index() {
  std::vector<std::byte> data;
  if (!read_file(options_.dir / "index", data, size_t{1} << 34)) return false;
  if (data.size() < 8 + 8 + 8 || std::memcmp(data.data(), kIndexMagic, 8) != 0) return false;
  const uint64_t count = get_u64(data.data() + 8);
  if (count > (data.size() - 24) / kIndexEntryBytes || 24 + count * kIndexEntryBytes != data.size()) return false;
  if (XXH3_64bits(data.data(), data.size() - 8) != get_u64(data.data() + data.size() - 8)) return false;
  // Entries oldest first: each goes to the front, so the newest ends up there.
  for (uint64_t i = 0; i < count; ++i) {
    const std::byte* at = data.data() + 16 + i * kIndexEntryBytes;
    kv::StableKey key;
    std::memcpy(key.bytes.data(), at, 32);
    const auto bytes = static_cast<int64_t>(get_u64(at + 32));
    if (bytes != static_cast<int64_t>(kRecordHeaderBytes + options_.block_bytes)) continue;  // another layout
    if (!entries_.contains(key)) add_entry_locked(key, bytes);
  }
  return true;
}

void DiskTier::rebuild_index() {
  struct Found {
    fs::file_time_type time;
    kv::StableKey key;
    int64_t bytes;
  };
  std::vector<Found> found;
  std::error_code ec;
  const int64_t expected = static_cast<int64_t>(kRecordHeaderBytes + options_.block_bytes);
  for (fs::directory_iterator it(blocks_dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path path = it->path();
    kv::StableKey key;
    std::error_code size_ec;
    const bool named = path.extension() == ".kvb" && parse_hex_key(path.stem().string(), key);
    const auto size = named ? static_cast<int64_t>(fs::file_size(path, size_ec)) : -1;
    bool keep = named && !size_ec && size == expected;
    if (keep) {
      std::byte header[kRecordHeaderBytes];
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      keep = fd >= 0 && ::pread(fd, header, sizeof(header), 0) == static_cast<ssize_t>(sizeof(header));
      if (fd >= 0) ::close(fd);
      if (keep) {
        auto h = parse_record_header(std::span<const std::byte>(header, sizeof(header)));
        keep = h.ok() && h->key == key && h->payload_bytes == options_.block_bytes;
      }
    }
    if (!keep) {  // leftovers of a crash (.tmp), a torn or foreign file
      fs::remove(path, ec);
      ec.clear();
      continue;
    }
    found.push_back({fs::last_write_time(path, size_ec), key, size});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.time < b.time; });
  for (const Found& f : found) add_entry_locked(f.key, f.bytes);
}

Status DiskTier::write_index() const {
  std::vector<std::byte> data;
  for (char c : kIndexMagic) data.push_back(static_cast<std::byte>(c));
  put_u64(data, entries_.size());
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {  // oldest first
    for (uint8_t b : it->bytes) data.push_back(static_cast<std::byte>(b));
    put_u64(data, static_cast<uint64_t>(entries_.at(*it).bytes));
  }
  put_u64(data, XXH3_64bits(data.data(), data.size()));
  const fs::path tmp = options_.dir / "index.tmp";
  if (const int err = write_new_file(tmp, data); err != 0)
    return io_error("disk KV tier: writing {}: {}", tmp.string(), std::strerror(err));
  std::error_code ec;
  fs::rename(tmp, options_.dir / "index", ec);
  if (ec) return io_error("disk KV tier: {}: {}", (options_.dir / "index").string(), ec.message());
  return ok_status();
}

DiskTier::~DiskTier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (lock_fd_ >= 0) {
    std::lock_guard lock(mutex_);
    (void)write_index();  // a failure only costs a scan at the next start
    ::close(lock_fd_);
  }
}

void DiskTier::add_entry_locked(const kv::StableKey& key, int64_t bytes) {
  lru_.push_front(key);
  entries_[key] = Entry{bytes, lru_.begin()};
  stats_.stored_bytes += bytes;
  ++stats_.stored_blocks;
}

void DiskTier::remove_entry_locked(const kv::StableKey& key) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return;
  stats_.stored_bytes -= it->second.bytes;
  --stats_.stored_blocks;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

void DiskTier::touch_locked(const kv::StableKey& key) {
  const auto it = entries_.find(key);
  if (it != entries_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru);
}

bool DiskTier::probably_holds(const kv::StableKey& key) const {
  std::lock_guard lock(mutex_);
  return entries_.contains(key) || queued_.contains(key);
}

int32_t DiskTier::read_into(std::span<const kv::StableKey> keys, std::span<const std::span<std::byte>> outs) {
  const size_t bb = options_.block_bytes;
  if (outs.size() != keys.size()) return 0;
  std::array<std::byte, kRecordHeaderBytes> header{};
  int32_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const kv::StableKey& key = keys[i];
    if (outs[i].size() != bb) break;
    {
      std::lock_guard lock(mutex_);
      if (!entries_.contains(key)) {
        ++stats_.miss_blocks;
        break;
      }
    }
    const auto start = std::chrono::steady_clock::now();
    const fs::path path = block_path(key);
    const bool read = read_record_split(path, header, outs[i]);
    const Status checked = read ? verify_record(header, key, outs[i]) : data_loss_error("missing, short or unreadable");
    std::lock_guard lock(mutex_);
    if (!checked.ok()) {
      // Never served: deleted, and the run ends here.
      std::error_code ec;
      fs::remove(path, ec);
      remove_entry_locked(key);
      ++stats_.corrupt_blocks;
      ++stats_.miss_blocks;
      break;
    }
    touch_locked(key);
    ++stats_.hit_blocks;
    stats_.bytes_read += static_cast<int64_t>(bb);
    stats_.observe_read(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    ++n;
  }
  return n;
}

void DiskTier::write_async(const kv::StableKey& key, std::vector<std::byte> block) {
  if (block.size() != options_.block_bytes) return;
  {
    std::lock_guard lock(mutex_);
    if (entries_.contains(key) || queued_.contains(key)) return;
    if (static_cast<int32_t>(queue_.size()) >= options_.max_queued_writes ||
        std::chrono::steady_clock::now() < paused_until_) {
      ++stats_.writes_dropped;
      return;
    }
    queued_.insert(key);
    queue_.push_back(Job{key, std::move(block)});
  }
  work_cv_.notify_one();
}

void DiskTier::flush() {
  std::unique_lock lock(mutex_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void DiskTier::writer_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stopping_) return;
      continue;
    }
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    write_one(job);
    lock.lock();
    queued_.erase(job.key);
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void DiskTier::write_one(Job& job) {
  const std::vector<std::byte> record = encode_record(job.key, job.block);
  const auto bytes = static_cast<int64_t>(record.size());
  std::error_code ec;
  {
    // Room first: least recently used blocks go.
    std::lock_guard lock(mutex_);
    if (std::chrono::steady_clock::now() < paused_until_) {
      ++stats_.writes_dropped;
      return;
    }
    while (stats_.stored_bytes + bytes > options_.capacity_bytes && !lru_.empty()) {
      const kv::StableKey victim = lru_.back();
      fs::remove(block_path(victim), ec);
      remove_entry_locked(victim);
      ++stats_.blocks_evicted;
    }
  }
  const fs::path final_path = block_path(job.key);
  fs::path tmp = final_path;
  tmp.replace_extension(".tmp");
  int err = write_new_file(tmp, record);
  if (err == 0) {
    fs::rename(tmp, final_path, ec);
    if (ec) err = ec.value();
  }
  std::lock_guard lock(mutex_);
  if (err != 0) {
    fs::remove(tmp, ec);
    ++stats_.write_errors;
    ++stats_.writes_dropped;
    if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
      stats_.writes_stopped = true;
      paused_until_ = std::chrono::steady_clock::now() + kDiskFullPause;
    }
    return;
  }
  stats_.writes_stopped = false;
  add_entry_locked(job.key, bytes);
  ++stats_.blocks_written;
  stats_.bytes_written += static_cast<int64_t>(job.block.size());
}

TierIoStats DiskTier::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::string DiskTier::describe() const {
  std::lock_guard lock(mutex_);
  return fmt::format("disk {} ({} bound, {} blocks held, index from {})", options_.dir.string(),
                     format_bytes_short(options_.capacity_bytes), stats_.stored_blocks, opened_from_);
}

}  // namespace pagoda::kvstore
