#pragma once
// A per-sequence constraint on which token may come next: what structured outputs (JSON Schema,
// regex, grammar; pagoda::grammar through server/structured_output.h) look like to the engine.
// The engine never sees grammars: it asks for a bitmask before sampling a row and reports the
// token it chose.
//
// A request carries one constraint in its initial state (GenerationRequest::constraint); every
// choice gets its own clone() when its sequence is created (n > 1 forks clone the parent's state
// at the fork). When the runner samples masked rows on the device
// (RunnerCapabilities::samples_masked_on_device) it asks for the mask during the step, after it
// has queued the forward (runtime::TokenMaskSource), and applies it there; otherwise the row is
// sampled on the host with the mask applied (apply_token_mask in sampler.h). After a token is
// accepted the engine asks for forced_tokens() (jump-forward; not for requests that report
// per-token logprobs or logits, which a token without a forward pass does not have).
//
// Thread safety: a constraint object is used by the engine thread only; clone() may be called
// on a constraint that other clones share state with (implementations make that safe).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace pagoda::engine {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;

  // Bits (64 per word, little-endian) of the tokens allowed next; `allowed` has
  // allowed_words(vocab_size) words. Returns how many tokens are allowed (0: none, a dead end).
  virtual size_t fill_allowed(std::span<uint64_t> allowed) = 0;
  // Moves past the sampled token; false when the constraint did not allow it.
  virtual bool accept(int32_t token) = 0;
  // An independent copy in the same state.
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
  // Jump-forward: tokens the constraint forces next whatever the model would pick (the text
  // every allowed continuation starts with, as the tokenizer writes it), written to `out`
  // (cleared first). The engine accepts and appends them without a forward pass of their own;
  // the next step computes them with the token after them. Default: none.
  virtual void forced_tokens(std::vector<int32_t>& out) { out.clear(); }
};

inline size_t allowed_words(int32_t vocab_size) { return (static_cast<size_t>(vocab_size) + 63) / 64; }

}  // namespace pagoda::engine
