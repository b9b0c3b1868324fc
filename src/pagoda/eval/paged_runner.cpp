#include "pagoda/eval/paged_runner.h"

#include <algorithm>

#include "pagoda/eval/log_probs.h"

namespace pagoda::eval {
namespace {

constexpr std::string_view kNamespace = "eval";

// Frees the sequence on every exit path, so an error mid-run leaks no blocks.
class SequenceGuard {
 public:
  SequenceGuard(kv::KvCacheManager& kv, kv::SequenceId seq) : kv_(kv), seq_(seq) {}
  ~SequenceGuard() {
    if (kv_.has_sequence(seq_)) (void)kv_.free_sequence(seq_);
  }
  SequenceGuard(const SequenceGuard&) = delete;
  SequenceGuard& operator=(const SequenceGuard&) = delete;

 private:
  kv::KvCacheManager& kv_;
  kv::SequenceId seq_;
};

}  // namespace

StatusOr<std::unique_ptr<PagedRunner>> PagedRunner::create(CpuModel& model,
                                                           const PagedRunnerOptions& options) {
  if (options.block_size < 1 || options.block_size > 256)
    return invalid_argument_error("block size must be in 1..256, got {}", options.block_size);
  if (options.prefill_chunk < 1)
    return invalid_argument_error("prefill chunk must be at least 1 token, got {}",
                                  options.prefill_chunk);
  if (options.max_sequence_tokens < 1)
    return invalid_argument_error("max sequence tokens must be positive, got {}",
                                  options.max_sequence_tokens);
  const int64_t blocks =
      (options.max_sequence_tokens + options.block_size - 1) / options.block_size + 1;
  if (blocks > (1 << 24)) return invalid_argument_error("{} KV blocks is too many", blocks);

  KvPoolShape shape = model.kv_pool_shape(static_cast<int32_t>(blocks), options.block_size);
  if (options.kv_dtype) shape.key_dtype = shape.value_dtype = *options.kv_dtype;
  if (options.key_dtype) shape.key_dtype = *options.key_dtype;
  if (options.value_dtype) shape.value_dtype = *options.value_dtype;
  PAGODA_ASSIGN_OR_RETURN(CpuKvPool pool, CpuKvPool::create(shape));

  kv::KvCacheConfig kv_config;
  kv_config.num_blocks = static_cast<int32_t>(blocks);
  kv_config.block_size = options.block_size;
  kv_config.enable_prefix_cache = false;
  kv_config.record_events = false;
  PAGODA_ASSIGN_OR_RETURN(auto kv, kv::KvCacheManager::create(kv_config));
  return std::unique_ptr<PagedRunner>(
      new PagedRunner(model, options, std::move(kv), std::move(pool)));
}

PagedRunner::PagedRunner(CpuModel& model, PagedRunnerOptions options,
                         std::unique_ptr<kv::KvCacheManager> kv, CpuKvPool pool)
    : model_(model), options_(options), kv_(std::move(kv)), pool_(std::move(pool)) {}

Status PagedRunner::check_tokens(std::span<const int32_t> tokens, int64_t extra) const {
  if (tokens.empty()) return invalid_argument_error("no tokens to run");
  const int64_t total = static_cast<int64_t>(tokens.size()) + extra;
  if (total > options_.max_sequence_tokens)
    return invalid_argument_error("sequence of {} tokens exceeds the runner's {} tokens", total,
                                  options_.max_sequence_tokens);
  const int32_t vocab = vocab_size();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      return invalid_argument_error("token id {} at position {} is outside the vocabulary (0..{})",
                                    tokens[i], i, vocab - 1);
  return ok_status();
}

Status PagedRunner::forward_range(kv::SequenceId seq, std::span<const int32_t> tokens,
                                  int64_t begin, int64_t end, bool all_logits,
                                  std::vector<float>& logits) {
  PAGODA_ASSIGN_OR_RETURN(auto table, kv_->block_table(seq));
  const int64_t blocks_needed = (end + options_.block_size - 1) / options_.block_size;
  if (static_cast<int64_t>(table.size()) < blocks_needed)
    return internal_error("block table holds {} blocks, {} tokens need {}", table.size(), end,
                          blocks_needed);
  batch_.token_ids.assign(tokens.begin() + begin, tokens.begin() + end);
  batch_.positions.resize(end - begin);
  for (int64_t i = begin; i < end; ++i) batch_.positions[i - begin] = static_cast<int32_t>(i);
  batch_.sequences.resize(1);
  SequenceSlice& slice = batch_.sequences[0];
  slice.token_offset = 0;
  slice.num_new_tokens = static_cast<int32_t>(end - begin);
  slice.num_cached_tokens = static_cast<int32_t>(begin);
  slice.block_table.assign(table.begin(), table.begin() + blocks_needed);
  slice.logits_for_all_new_tokens = all_logits;
  slice.logits_for_last_token = true;
  PAGODA_RETURN_IF_ERROR(model_.forward(batch_, pool_, logits));
  return kv_->mark_computed(seq, end - begin);
}

Status PagedRunner::score(std::span<const int32_t> tokens, std::vector<float>& logits) {
  PAGODA_RETURN_IF_ERROR(check_tokens(tokens, 0));
  const kv::SequenceId seq = next_sequence_++;
  PAGODA_ASSIGN_OR_RETURN(auto match, kv_->allocate_sequence(seq, kNamespace, tokens));
  SequenceGuard guard(*kv_, seq);
  if (match.cached_tokens != 0)
    return internal_error("prefix cache is off, yet {} tokens matched", match.cached_tokens);

  const int64_t n = static_cast<int64_t>(tokens.size());
  const size_t vocab = static_cast<size_t>(vocab_size());
  logits.resize(static_cast<size_t>(n) * vocab);
  std::vector<float> chunk_logits;
  for (int64_t begin = 0; begin < n; begin += options_.prefill_chunk) {
    const int64_t end = std::min<int64_t>(n, begin + options_.prefill_chunk);
    PAGODA_RETURN_IF_ERROR(forward_range(seq, tokens, begin, end, true, chunk_logits));
    if (chunk_logits.size() != static_cast<size_t>(end - begin) * vocab)
      return internal_error("forward returned {} logits for {} tokens", chunk_logits.size(),
                            end - begin);
    std::copy(chunk_logits.begin(), chunk_logits.end(), logits.begin() + begin * vocab);
  }
  return kv_->free_sequence(seq);
}

StatusOr<GreedyOutput> PagedRunner::greedy(std::span<const int32_t> prompt,
                                           int32_t max_new_tokens,
                                           std::span<const int32_t> stop_ids) {
  if (max_new_tokens < 0)
    return invalid_argument_error("max new tokens must be >= 0, got {}", max_new_tokens);
  PAGODA_RETURN_IF_ERROR(check_tokens(prompt, max_new_tokens));
  const kv::SequenceId seq = next_sequence_++;
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  PAGODA_RETURN_IF_ERROR(kv_->allocate_sequence(seq, kNamespace, tokens).status());
  SequenceGuard guard(*kv_, seq);

  GreedyOutput out;
  std::vector<float> logits;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t begin = 0; begin < n; begin += options_.prefill_chunk) {
    const int64_t end = std::min<int64_t>(n, begin + options_.prefill_chunk);
    PAGODA_RETURN_IF_ERROR(forward_range(seq, tokens, begin, end, false, logits));
  }
  for (int32_t step = 0; step < max_new_tokens; ++step) {
    if (logits.size() != static_cast<size_t>(vocab_size()))
      return internal_error("forward returned {} logits, expected one row", logits.size());
    const int32_t next = argmax(logits);
    out.tokens.push_back(next);
    out.logits.push_back(logits);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
    if (step + 1 == max_new_tokens) break;
    const int32_t appended[] = {next};
    PAGODA_RETURN_IF_ERROR(kv_->append_tokens(seq, appended));
    tokens.push_back(next);
    const int64_t end = static_cast<int64_t>(tokens.size());
    PAGODA_RETURN_IF_ERROR(forward_range(seq, tokens, end - 1, end, false, logits));
  }
  PAGODA_RETURN_IF_ERROR(kv_->free_sequence(seq));
  return out;
}

}  // namespace pagoda::eval
