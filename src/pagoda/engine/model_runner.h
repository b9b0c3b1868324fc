#pragma once
// The engine's seam to a model: runs one planned step and returns logits.
// The engine owns scheduling and KV block ids; the runner owns weights and KV
// memory. A fake runner in tests makes the scheduler testable without weights.
//
// Thread safety: called from the engine thread only.

#include <cstdint>
#include <span>
#include <vector>

#include "pagoda/core/status.h"
#include "pagoda/kv/kv_types.h"
#include "pagoda/model/forward_batch.h"

namespace pagoda::engine {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Runs the forward; returns batch.num_logit_rows() rows of vocab_size()
  // floats, row-major, in the order ForwardBatch documents.
  virtual StatusOr<std::vector<float>> execute(const ForwardBatch& batch) = 0;
  // Copies block src -> dst in every layer (copy-on-write forks); runs before
  // the next execute().
  virtual Status copy_blocks(std::span<const kv::BlockCopy> copies) = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t max_context_length() const = 0;
  virtual std::vector<int32_t> eos_token_ids() const = 0;
};

}  // namespace pagoda::engine
