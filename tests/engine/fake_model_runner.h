#pragma once
// A deterministic stand-in for a model that still depends on the KV cache
// being right: every new token is written into a slot pool through the block
// table, and the logits of a row are a function of every token read back from
// the pool for positions [0, pos]. A wrong block table, a bad prefix hit or a
// missed copy-on-write copy changes the output, and reference_next_token()
// gives what the output must be, computed from the token list directly.

#include <cstdint>
#include <deque>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "pagoda/runtime/model_runner.h"
#include "pagoda/engine/sampler.h"

namespace pagoda::engine::testing {

using runtime::BlockCopy;
using runtime::RowSampling;
using runtime::StepResult;

class FakeModelRunner final : public runtime::ModelRunner {
 public:
  // num_host_blocks > 0: a host pool of that many blocks, for the host tier.
  FakeModelRunner(int32_t num_blocks, int32_t block_size, int32_t vocab_size = 64, int32_t max_context = 4096,
                  std::vector<int32_t> eos = {}, int32_t num_host_blocks = 0)
      : num_blocks_(num_blocks), block_size_(block_size), vocab_(vocab_size), max_context_(max_context),
        num_host_blocks_(num_host_blocks), eos_(std::move(eos)),
        pool_(static_cast<size_t>(num_blocks) * block_size, -1),
        host_pool_(static_cast<size_t>(num_host_blocks) * block_size, -1) {
    geometry_.num_layers = 1;
    geometry_.num_blocks = num_blocks;
    geometry_.block_size = block_size;
    geometry_.num_kv_heads = 1;
    geometry_.head_dim = 1;
  }

  static uint64_t context_hash(std::span<const int32_t> tokens) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : tokens) h = (h ^ static_cast<uint64_t>(t + 1)) * 1099511628211ull;
    return h;
  }
  // Logits for the token after `context`: one clear winner, a runner-up, and a tail.
  static void fill_logits(std::span<const int32_t> context, int32_t vocab, float* out) {
    const uint64_t h = context_hash(context);
    for (int32_t i = 0; i < vocab; ++i) out[i] = static_cast<float>((h >> (i % 48)) & 7) * 0.1f;
    out[h % vocab] += 5.0f;
    out[(h / vocab) % vocab] += 4.0f;
  }
  int32_t reference_next_token(std::span<const int32_t> context) const {
    std::vector<float> row(vocab_);
    fill_logits(context, vocab_, row.data());
    int32_t best = 0;
    for (int32_t i = 1; i < vocab_; ++i)
      if (row[i] > row[best]) best = i;
    return best;
  }
  // Greedy continuation of `prompt` for `n` tokens, stopping at eos.
  std::vector<int32_t> reference_greedy(std::vector<int32_t> prompt, int32_t n) const {
    std::vector<int32_t> out;
    for (int32_t i = 0; i < n; ++i) {
      int32_t t = reference_next_token(prompt);
      bool is_eos = false;
      for (int32_t e : eos_) is_eos |= e == t;
      if (is_eos) break;
      out.push_back(t);
      prompt.push_back(t);
    }
    return out;
  }

  // Every logits row of the batch, as the model computes them.
  StatusOr<std::vector<float>> all_logits(const ForwardBatch& batch) {
    ++num_executes;
    max_batch_tokens = std::max(max_batch_tokens, batch.num_tokens());
    if (fail_next) {
      fail_next = false;
      return internal_error("injected failure");
    }
    std::vector<float> logits;
    for (const SequenceSlice& s : batch.sequences) {
      const int32_t end = s.num_cached_tokens + s.num_new_tokens;
      if (static_cast<int32_t>(s.block_table.size()) * block_size_ < end)
        return internal_error("block table covers {} blocks, {} tokens needed", s.block_table.size(), end);
      for (int32_t i = 0; i < s.num_new_tokens; ++i) {
        const int32_t pos = s.num_cached_tokens + i;
        if (batch.positions[s.token_offset + i] != pos) return internal_error("bad position");
        PAGODA_ASSIGN_OR_RETURN(size_t slot, slot_of(s.block_table, pos));
        pool_[slot] = batch.token_ids[s.token_offset + i];
      }
      const int32_t first = s.logits_for_all_new_tokens ? s.num_cached_tokens : end - 1;
      if (!s.logits_for_all_new_tokens && !s.logits_for_last_token) continue;
      for (int32_t row_end = first + 1; row_end <= end; ++row_end) {
        std::vector<int32_t> context(row_end);
        for (int32_t pos = 0; pos < row_end; ++pos) {
          PAGODA_ASSIGN_OR_RETURN(size_t slot, slot_of(s.block_table, pos));
          context[pos] = pool_[slot];
        }
        logits.resize(logits.size() + vocab_);
        fill_logits(context, vocab_, logits.data() + logits.size() - vocab_);
      }
    }
    return logits;
  }
  // Device sampling (when `device_sampling` is set): on_device rows are drawn
  // here with the CPU sampler from an RNG keyed by (seed, step) only, like a
  // counter-based device sampler; the other rows' logits go back to the engine.
  runtime::RunnerCapabilities capabilities() const override {
    return {.samples_on_device = device_sampling,
            .samples_masked_on_device = device_sampling && device_masking,
            .scores_on_device = device_scoring,
            .edits_logits_on_device = device_sampling && device_logit_edits,
            .host_kv_blocks = num_host_blocks_,
            .overlaps_steps = lazy_launch};
  }
  // Overlapped steps. With lazy_launch, launch() only queues the step and
  // collect() runs it, as a device runs its queue in order while the host goes
  // on: a step's K/V is written, and its deferred tokens are read from the step
  // before, only when the engine collects it, so anything the engine does
  // between (freeing blocks, copies, transfers) meets the pool as a device
  // would. Without it, the default launch() runs the step at once.
  Status launch(const ForwardBatch& batch, std::span<const RowSampling> rows) override {
    ++num_launches;
    if (!lazy_launch) return runtime::ModelRunner::launch(batch, rows);
    if (queued_.size() >= 2) return internal_error("launch: two steps already queued");
    const int32_t previous_rows = queued_.empty() ? 0 : queued_.back().batch.num_logit_rows();
    PAGODA_RETURN_IF_ERROR(runtime::check_launch(batch, rows, previous_rows));
    queued_.push_back(Queued{batch, std::vector<RowSampling>(rows.begin(), rows.end())});
    max_steps_launched = std::max(max_steps_launched, static_cast<int32_t>(queued_.size()));
    num_deferred_tokens += static_cast<int64_t>(batch.deferred_tokens.size());
    return ok_status();
  }
  StatusOr<StepResult> collect() override {
    if (!lazy_launch) return runtime::ModelRunner::collect();
    if (queued_.empty()) return internal_error("collect: nothing launched");
    Queued q = std::move(queued_.front());
    queued_.pop_front();
    for (const DeferredToken& d : q.batch.deferred_tokens) {
      if (static_cast<size_t>(d.source_row) >= last_tokens_.size())
        return internal_error("the step whose tokens this one takes failed");
      q.batch.token_ids[static_cast<size_t>(d.token_index)] = last_tokens_[static_cast<size_t>(d.source_row)];
    }
    q.batch.deferred_tokens.clear();
    StatusOr<StepResult> result = execute(q.batch, q.rows);
    last_tokens_ = result.ok() ? result->tokens : std::vector<int32_t>{};
    return result;
  }
  size_t steps_queued() const { return queued_.size(); }
  StatusOr<StepResult> execute(const ForwardBatch& batch, std::span<const RowSampling> rows) override {
    PAGODA_RETURN_IF_ERROR(runtime::check_row_sampling(batch, rows, capabilities()));
    if (device_sampling) sampled_rows.emplace_back(rows.begin(), rows.end());
    PAGODA_ASSIGN_OR_RETURN(std::vector<float> logits, all_logits(batch));
    // Deferred masks are asked for after the "forward", as a device runner does once it has
    // queued its kernels.
    const size_t words = (static_cast<size_t>(vocab_) + 63) / 64;
    std::vector<std::vector<uint64_t>> deferred(rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      if (rows[r].mask_source == nullptr) continue;
      deferred[r].assign(words, ~uint64_t{0});  // garbage on entry, as the contract allows
      rows[r].mask_source->fill_mask(r, deferred[r]);
      ++num_deferred_masks;
    }
    StepResult out;
    const size_t num_rows = static_cast<size_t>(batch.num_logit_rows());
    out.tokens.assign(num_rows, 0);
    out.logprobs.assign(num_rows, 0.0f);
    for (size_t r = 0; r < num_rows; ++r) {
      std::span<const float> row(logits.data() + r * vocab_, vocab_);
      if (!rows.empty() && rows[r].scored()) {  // scored here, with the CPU's scoring, as a device would
        out.scores.push_back(row_score(score_token(row, rows[r].score_token, rows[r].score_top_k)));
        ++num_scored_rows;
        continue;
      }
      if (rows.empty() || !rows[r].on_device) {
        out.host_logits.insert(out.host_logits.end(), row.begin(), row.end());
        continue;
      }
      SamplingParams params;
      params.temperature = rows[r].temperature;
      params.top_k = rows[r].top_k;
      params.top_p = rows[r].top_p;
      params.min_p = rows[r].min_p;
      std::mt19937_64 rng(rows[r].seed ^ (rows[r].step * 0x9E3779B97F4A7C15ull));
      std::vector<float> masked(row.begin(), row.end());
      const uint64_t* mask = rows[r].mask_source != nullptr ? deferred[r].data() : rows[r].allowed;
      if (mask != nullptr && !ignore_masks) apply_token_mask(masked, std::span<const uint64_t>(mask, words));
      // The row's logit edits applied from its list alone, as a device applies them (RowSampling's
      // order); the draw from the edited row, the logprob from the raw (masked) one.
      std::vector<float> edited = masked;
      apply_edits(rows[r], edited);
      num_logit_edits += static_cast<int64_t>(rows[r].logit_edits.size());
      const SampledToken t = Sampler::sample(edited, params, {}, rng);
      out.tokens[r] = t.token;
      out.logprobs[r] = score_token(masked, t.token, 0).logprob;
      // Top logprobs of the drawn token, scored as a device would.
      if (rows[r].reports_score()) out.scores.push_back(row_score(score_token(masked, t.token, rows[r].score_top_k)));
    }
    if (drop_a_token && !out.tokens.empty()) out.tokens.pop_back();
    if (out_of_vocab_token && !out.tokens.empty()) out.tokens[0] = vocab_ + 5;
    return out;
  }
  static runtime::RowScore row_score(const SampledToken& t) {
    runtime::RowScore score;
    score.logprob = t.logprob;
    score.rank = t.rank;
    for (const TokenLogprob& top : t.top_logprobs) {
      score.top_tokens.push_back(top.token);
      score.top_logprobs.push_back(top.logprob);
    }
    return score;
  }
  // RowSampling::logit_edits on one row: a ban or a bias, then repetition on seen tokens, then
  // frequency and presence on tokens with an output count.
  static void apply_edits(const RowSampling& row, std::vector<float>& logits) {
    for (const runtime::LogitEdit& e : row.logit_edits) {
      if (e.token < 0 || e.token >= static_cast<int32_t>(logits.size())) continue;
      float& v = logits[static_cast<size_t>(e.token)];
      if (e.flags & runtime::LogitEdit::kBanned) v = -std::numeric_limits<float>::infinity();
      else if (e.flags & runtime::LogitEdit::kBiased) v += e.bias;
      if (row.repetition_penalty != 1.0f && (e.flags & runtime::LogitEdit::kSeen))
        v = v > 0 ? v / row.repetition_penalty : v * row.repetition_penalty;
      if ((row.frequency_penalty != 0.0f || row.presence_penalty != 0.0f) && e.output_count > 0)
        v -= row.frequency_penalty * static_cast<float>(e.output_count) + row.presence_penalty;
    }
  }
  Status copy_blocks(std::span<const BlockCopy> copies) override {
    for (const auto& c : copies) {
      if (c.src < 0 || c.src >= num_blocks_ || c.dst < 0 || c.dst >= num_blocks_) return internal_error("bad copy");
      std::copy_n(pool_.begin() + static_cast<size_t>(c.src) * block_size_, block_size_,
                  pool_.begin() + static_cast<size_t>(c.dst) * block_size_);
      ++num_block_copies;
    }
    return ok_status();
  }
  // Copies token slots between the pools; a failing call (fail_transfers > 0)
  // first writes garbage into every destination, as a half-done copy would.
  Status transfer_blocks(std::span<const runtime::BlockTransfer> transfers) override {
    if (transfers.empty()) return ok_status();
    if (num_host_blocks_ == 0) return runtime::ModelRunner::transfer_blocks(transfers);
    PAGODA_RETURN_IF_ERROR(runtime::check_block_transfers(transfers, num_blocks_, num_host_blocks_));
    const bool fail = fail_transfers > 0;
    for (const auto& t : transfers) {
      auto device = pool_.begin() + static_cast<size_t>(t.device_block) * block_size_;
      auto host = host_pool_.begin() + static_cast<size_t>(t.host_block) * block_size_;
      const bool to_host = t.direction == runtime::TransferDirection::kDeviceToHost;
      if (fail) std::fill_n(to_host ? host : device, block_size_, vocab_ - 1);
      else if (to_host) std::copy_n(device, block_size_, host);
      else std::copy_n(host, block_size_, device);
      ++num_transfers[static_cast<int>(t.direction)];
    }
    if (fail) {
      --fail_transfers;
      return internal_error("injected transfer failure");
    }
    last_transfer_done_ = std::chrono::steady_clock::now();
    return ok_status();
  }
  std::optional<std::chrono::steady_clock::time_point> last_transfer_done_at() const override {
    return last_transfer_done_;
  }
  const KvPoolShape& kv_geometry() const override { return geometry_; }
  int32_t vocab_size() const override { return vocab_; }
  int32_t max_context_length() const override { return max_context_; }
  std::vector<int32_t> eos_token_ids() const override { return eos_; }

  int64_t num_executes = 0;
  int64_t num_block_copies = 0;
  int64_t num_deferred_masks = 0;  // RowSampling::mask_source calls
  int64_t num_transfers[runtime::kNumTransferDirections] = {0, 0};
  std::optional<std::chrono::steady_clock::time_point> last_transfer_done_;
  int32_t fail_transfers = 0;  // the next this many transfer_blocks calls fail
  int32_t max_batch_tokens = 0;
  bool fail_next = false;
  bool device_sampling = false;
  bool device_scoring = false;       // RowSampling::score_token is honoured (scored with score_token)
  bool device_logit_edits = false;     // with device_sampling: RowSampling's penalties are honoured
  int64_t num_logit_edits = 0;    // RowSampling::logit_edits entries seen on device rows
  int64_t num_scored_rows = 0;
  bool lazy_launch = false;          // launch() queues, collect() runs (see launch())
  int64_t num_launches = 0;
  int64_t num_deferred_tokens = 0;   // with lazy_launch: inputs taken from the step before
  int32_t max_steps_launched = 0;    // with lazy_launch: most steps queued at once
  bool device_masking = false;      // with device_sampling: RowSampling::allowed is honoured
  bool ignore_masks = false;        // a broken runner: claims device masking, samples unmasked
  bool drop_a_token = false;        // a broken runner: one token short
  bool out_of_vocab_token = false;  // a broken runner: a token id past the vocabulary
  std::vector<std::vector<RowSampling>> sampled_rows;  // per execute call, with device_sampling

 private:
  KvPoolShape geometry_;
  struct Queued {
    ForwardBatch batch;
    std::vector<RowSampling> rows;
  };
  std::deque<Queued> queued_;
  std::vector<int32_t> last_tokens_;
  StatusOr<size_t> slot_of(const std::vector<int32_t>& table, int32_t pos) const {
    const int32_t block = table[pos / block_size_];
    if (block < 0 || block >= num_blocks_) return internal_error("block id {} out of range", block);
    return static_cast<size_t>(block) * block_size_ + pos % block_size_;
  }

  int32_t num_blocks_, block_size_, vocab_, max_context_, num_host_blocks_;
  std::vector<int32_t> eos_;
  std::vector<int32_t> pool_;
  std::vector<int32_t> host_pool_;
};

}  // namespace pagoda::engine::testing
