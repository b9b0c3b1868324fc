#include "pagoda/engine/lower_tier_loader.h"

#include <algorithm>
#include <utility>

namespace pagoda::engine {
namespace {

// Blocks per disk chunk at least: a chunk is one task, and tiny ones cost more to hand out than to read.
constexpr size_t kMinChunkBlocks = 4;
// Blocks per redis round trip (the redis tier pipelines its GETs in batches of this size too).
constexpr size_t kRedisRound = 32;

}  // namespace

struct LowerTierLoader::Job {
  std::unique_ptr<Load> load;
  std::vector<std::pair<size_t, size_t>> chunks;  // [begin, end) of the disk part
  std::vector<int32_t> chunk_read;                // blocks read intact from each chunk's start
  int32_t chunks_left = 0;
  bool cancelled = false;
};

LowerTierLoader::LowerTierLoader(kvstore::LowerTiers& tiers, int32_t threads, std::function<void()> on_finished)
    : tiers_(tiers), on_finished_(std::move(on_finished)) {
  for (int32_t i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { loop(); });
}

LowerTierLoader::~LowerTierLoader() {
  {
    std::lock_guard lock(mutex_);
    for (auto& job : jobs_) job->cancelled = true;
  }
  wait_idle();
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void LowerTierLoader::submit(std::unique_ptr<Load> load) {
  auto job = std::make_unique<Job>();
  Job& j = *job;
  j.load = std::move(load);
  Load& l = *j.load;
  l.disk_read = l.redis_read = 0;
  const size_t n = std::min(l.disk_hosts.size(), l.keys.size());
  l.disk_memory.resize(n);
  l.disk_hosts.resize(n);
  if (tiers_.disk() == nullptr) {
    l.disk_hosts.clear();
    l.disk_memory.clear();
  }
  if (tiers_.redis() == nullptr) l.try_redis = false;
  const size_t disk_blocks = l.disk_hosts.size();
  const size_t chunks = std::min(threads_.size(), (disk_blocks + kMinChunkBlocks - 1) / kMinChunkBlocks);
  for (size_t c = 0; c < chunks; ++c) j.chunks.emplace_back(disk_blocks * c / chunks, disk_blocks * (c + 1) / chunks);
  j.chunk_read.assign(chunks, 0);
  j.chunks_left = static_cast<int32_t>(chunks);
  {
    std::lock_guard lock(mutex_);
    ++in_flight_;
    jobs_.push_back(std::move(job));
    if (chunks == 0) {
      disk_done_locked(j);
    } else {
      for (size_t c = 0; c < chunks; ++c) tasks_.push_back(Task{&j, static_cast<int32_t>(c)});
    }
  }
  work_.notify_all();
}

void LowerTierLoader::cancel(kv::SequenceId sequence) {
  std::lock_guard lock(mutex_);
  for (auto& job : jobs_)
    if (job->load->sequence == sequence) job->cancelled = true;
}

std::vector<std::unique_ptr<LowerTierLoader::Load>> LowerTierLoader::take_finished() {
  std::lock_guard lock(mutex_);
  std::vector<std::unique_ptr<Load>> out;
  out.swap(finished_);
  in_flight_ -= static_cast<int32_t>(out.size());
  return out;
}

int32_t LowerTierLoader::in_flight() const {
  std::lock_guard lock(mutex_);
  return in_flight_;
}

void LowerTierLoader::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return jobs_.empty(); });
}

void LowerTierLoader::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stop_, and nothing left
    const Task task = tasks_.front();
    tasks_.pop_front();
    Job& job = *task.job;
    const bool skip = job.cancelled;
    lock.unlock();
    if (!skip) {
      if (task.chunk >= 0) run_disk_chunk(job, task.chunk);
      else run_redis(job);
    }
    lock.lock();
    if (task.chunk >= 0) {
      if (--job.chunks_left == 0) disk_done_locked(job);
    } else {
      finish_locked(job);
    }
    const bool notify = !finished_.empty();
    if (notify && on_finished_) {
      lock.unlock();
      on_finished_();
      lock.lock();
    }
  }
}

void LowerTierLoader::run_disk_chunk(Job& job, int32_t chunk) {
  Load& l = *job.load;
  const auto [begin, end] = job.chunks[static_cast<size_t>(chunk)];
  const int32_t got = tiers_.disk()->read_into(std::span(l.keys).subspan(begin, end - begin),
                                               std::span(l.disk_memory).subspan(begin, end - begin));
  std::lock_guard lock(mutex_);
  job.chunk_read[static_cast<size_t>(chunk)] = got;
}

void LowerTierLoader::disk_done_locked(Job& job) {
  Load& l = *job.load;
  // The run is what was read intact from its start: a chunk after a short one does not count.
  int32_t read = 0;
  for (size_t c = 0; c < job.chunks.size(); ++c) {
    read += job.chunk_read[c];
    if (static_cast<size_t>(job.chunk_read[c]) < job.chunks[c].second - job.chunks[c].first) break;
  }
  l.disk_read = read;
  const bool whole_disk_part = static_cast<size_t>(read) == l.disk_hosts.size();
  if (l.try_redis && whole_disk_part && !job.cancelled && static_cast<size_t>(read) < l.keys.size()) {
    tasks_.push_back(Task{&job, -1});
    work_.notify_one();
    return;
  }
  finish_locked(job);
}

void LowerTierLoader::run_redis(Job& job) {
  Load& l = *job.load;
  kvstore::BlockStore* redis = tiers_.redis();
  const size_t bb = tiers_.block_bytes();
  const auto keys = std::span<const kv::StableKey>(l.keys).subspan(static_cast<size_t>(l.disk_read));
  size_t at = 0;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (job.cancelled) break;
    }
    if (at >= keys.size()) break;
    const size_t n = std::min(kRedisRound, keys.size() - at);
    l.redis_data.resize((at + n) * bb);
    const int32_t got = redis->read_prefix(keys.subspan(at, n), std::span(l.redis_data).subspan(at * bb, n * bb));
    at += static_cast<size_t>(got);
    if (static_cast<size_t>(got) < n) break;
  }
  l.redis_data.resize(at * bb);
  l.redis_read = static_cast<int32_t>(at);
  // What came from redis is kept on disk too, for the next restart.
  if (kvstore::BlockStore* disk = tiers_.disk(); disk != nullptr) {
    for (size_t i = 0; i < at; ++i) {
      const auto block = std::span(l.redis_data).subspan(i * bb, bb);
      disk->write_async(keys[i], std::vector<std::byte>(block.begin(), block.end()));
    }
  }
}

void LowerTierLoader::finish_locked(Job& job) {
  job.load->cancelled = job.cancelled;
  finished_.push_back(std::move(job.load));
  std::erase_if(jobs_, [&](const std::unique_ptr<Job>& j) { return j.get() == &job; });
  idle_.notify_all();
}

}  // namespace pagoda::engine
