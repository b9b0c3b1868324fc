#pragma once
// A ModelRunner that forwards every call to another runner: a base for
// decorators that change one thing (hide device sampling, hide eos ids, time
// each step) without restating the rest.
//
// Thread safety: as the inner runner's.

#include "pagoda/runtime/model_runner.h"

namespace pagoda::runtime {

class DelegatingModelRunner : public ModelRunner {
 public:
  explicit DelegatingModelRunner(ModelRunner& inner) : inner_(inner) {}

  StatusOr<StepResult> execute(const ForwardBatch& batch, std::span<const RowSampling> rows) override {
    return inner_.execute(batch, rows);
  }
  Status copy_blocks(std::span<const BlockCopy> copies) override { return inner_.copy_blocks(copies); }
  Status zero_blocks(std::span<const int32_t> blocks) override { return inner_.zero_blocks(blocks); }
  Status transfer_blocks(std::span<const BlockTransfer> transfers) override {
    return inner_.transfer_blocks(transfers);
  }
  TransferStats transfer_stats() const override { return inner_.transfer_stats(); }
  std::optional<std::chrono::steady_clock::time_point> last_transfer_done_at() const override {
    return inner_.last_transfer_done_at();
  }
  Status compact_kv(const KvCompaction& compaction) override { return inner_.compact_kv(compaction); }
  void release_kv_state(int64_t kv_state) override { inner_.release_kv_state(kv_state); }
  Status read_host_block(int32_t host_block, std::span<std::byte> out) override {
    return inner_.read_host_block(host_block, out);
  }
  Status write_host_block(int32_t host_block, std::span<const std::byte> data) override {
    return inner_.write_host_block(host_block, data);
  }
  StatusOr<std::vector<std::span<std::byte>>> host_blocks_for_writing(std::span<const int32_t> blocks) override {
    return inner_.host_blocks_for_writing(blocks);
  }
  const KvPoolShape& kv_geometry() const override { return inner_.kv_geometry(); }
  RunnerCapabilities capabilities() const override { return inner_.capabilities(); }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t max_context_length() const override { return inner_.max_context_length(); }
  std::vector<int32_t> eos_token_ids() const override { return inner_.eos_token_ids(); }

 protected:
  ModelRunner& inner() { return inner_; }

 private:
  ModelRunner& inner_;
};

}  // namespace pagoda::runtime
