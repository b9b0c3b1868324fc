#pragma once
// The engine's seam to a model: runs one planned step and returns logits, or,
// for a runner that samples on its device, the sampled tokens of the rows the
// engine flags and logits only for the others (requests with logprobs,
// penalties, n > 1 before the fork). The engine owns scheduling and KV block
// ids; the runner owns weights and KV memory. A fake runner in tests makes the
// scheduler testable without weights.
//
// Thread safety: called from the engine thread only.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/kv/kv_types.h"
#include "pagoda/model/forward_batch.h"

namespace pagoda::engine {

// How one logits row is sampled on the device: the sampler's temperature (0:
// argmax), min-p, top-k and top-p (engine/sampler.h order and semantics), and
// a counter-based key: the draw depends only on (seed, step) and the row, so a
// seeded request is reproducible whatever else is batched with it.
struct DeviceSampling {
  bool on_device = false;  // false: the runner returns this row's logits instead
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;  // per sequence
  uint64_t step = 0;  // the sequence's output index
};

struct SampledStep {
  // Per logits row (batch.num_logit_rows()): the token and its log-probability
  // under the raw distribution (log-softmax of the logits); set for on_device rows.
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  // vocab_size() floats per row that is not on_device, in row order.
  std::vector<float> host_logits;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Runs the forward; returns batch.num_logit_rows() rows of vocab_size()
  // floats, row-major, in the order ForwardBatch documents.
  virtual StatusOr<std::vector<float>> execute(const ForwardBatch& batch) = 0;
  // True when execute_sampled() can sample rows on the device; the engine then
  // calls it instead of execute() and flags the rows it may sample there.
  virtual bool samples_on_device() const { return false; }
  // `rows` has one entry per logits row. The default (host-only runners)
  // supports no on_device row: it returns execute()'s logits as host_logits.
  virtual StatusOr<SampledStep> execute_sampled(const ForwardBatch& batch, std::span<const DeviceSampling> rows);
  // Copies block src -> dst in every layer (copy-on-write forks); runs before
  // the next execute().
  virtual Status copy_blocks(std::span<const kv::BlockCopy> copies) = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t max_context_length() const = 0;
  virtual std::vector<int32_t> eos_token_ids() const = 0;
};

inline StatusOr<SampledStep> ModelRunner::execute_sampled(const ForwardBatch& batch,
                                                          std::span<const DeviceSampling> rows) {
  for (const DeviceSampling& row : rows)
    if (row.on_device) return unimplemented_error("this model runner does not sample on the device");
  SampledStep out;
  PAGODA_ASSIGN_OR_RETURN(out.host_logits, execute(batch));
  out.tokens.assign(rows.size(), 0);
  out.logprobs.assign(rows.size(), 0.0f);
  return out;
}

}  // namespace pagoda::engine
