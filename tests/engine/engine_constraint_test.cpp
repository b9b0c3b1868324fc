// Structured outputs in the engine: rows with a TokenConstraint sample only allowed tokens, each
// choice advances its own clone, and a dead end fails the request instead of emitting junk.

#include <gtest/gtest.h>

#include "engine_harness.h"
#include "pagoda/engine/engine.h"

namespace pagoda::engine {
namespace {

using testing_support::Collected;
using testing_support::drain;
using testing_support::Harness;

// Allows the tokens of a cycle: after token cycle[i] only cycle[i + 1] or the "free" set.
class CycleConstraint : public TokenConstraint {
 public:
  CycleConstraint(std::vector<int32_t> allowed, int32_t dead_after) : allowed_(std::move(allowed)), dead_after_(dead_after) {}
  size_t fill_allowed(std::span<uint64_t> mask) override {
    ++fills_;
    if (accepted_ >= dead_after_) return 0;
    size_t set = 0;
    for (int32_t t : allowed_) {
      // Tokens must lie inside the mask the engine hands over (one bit per vocabulary id).
      if (t < 0 || static_cast<size_t>(t >> 6) >= mask.size()) {
        ADD_FAILURE() << "token " << t << " outside a mask of " << mask.size() * 64 << " ids";
        continue;
      }
      mask[t >> 6] |= uint64_t{1} << (t & 63);
      ++set;
    }
    return set;
  }
  bool accept(int32_t token) override {
    if (std::find(allowed_.begin(), allowed_.end(), token) == allowed_.end()) return false;
    ++accepted_;
    return true;
  }
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<CycleConstraint>(*this); }

  int32_t accepted_ = 0;
  int32_t fills_ = 0;

 private:
  std::vector<int32_t> allowed_;
  int32_t dead_after_;
};

GenerationRequest request(int32_t max_tokens, std::shared_ptr<const TokenConstraint> constraint) {
  GenerationRequest r;
  r.tenant_namespace = "t";
  r.prompt_tokens = {1, 2, 3, 4, 5, 6, 7};
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 7;
  r.sampling.max_tokens = max_tokens;
  r.constraint = std::move(constraint);
  return r;
}

TEST(EngineConstraintTest, EveryChoiceSamplesOnlyAllowedTokens) {
  Harness h(128, 4);
  const std::vector<int32_t> allowed = {3, 17, 40, 63};
  for (int32_t n : {1, 3}) {
    GenerationRequest r = request(12, std::make_shared<CycleConstraint>(allowed, 1000));
    r.sampling.n = n;
    auto stream = h.engine->submit(r);
    ASSERT_TRUE(stream.ok()) << stream.status().to_string();
    h.run_checked();
    Collected c = drain(**stream, n);
    ASSERT_TRUE(c.finished);
    for (int32_t i = 0; i < n; ++i) {
      ASSERT_EQ(c.tokens[i].size(), 12u) << "choice " << i;
      for (int32_t t : c.tokens[i]) EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end()) << t;
    }
  }
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

TEST(EngineConstraintTest, GreedyPicksTheBestAllowedToken) {
  Harness h(128, 4);
  GenerationRequest r = request(6, std::make_shared<CycleConstraint>(std::vector<int32_t>{11}, 1000));
  r.sampling.temperature = 0.0f;
  auto stream = *h.engine->submit(r);
  h.run_checked();
  Collected c = drain(*stream);
  EXPECT_EQ(c.tokens[0], std::vector<int32_t>(6, 11));
}

TEST(EngineConstraintTest, ADeadEndFailsTheRequest) {
  Harness h(128, 4);
  auto stream = *h.engine->submit(request(10, std::make_shared<CycleConstraint>(std::vector<int32_t>{5, 6}, 3)));
  h.run_checked();
  Collected c = drain(*stream);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.tokens[0].size(), 3u);
  EXPECT_EQ(c.error_code, StatusCode::kInternal);
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

TEST(EngineConstraintTest, ConstrainedRowsTakeTheHostPathUnderADeviceSampler) {
  Harness h(128, 4);
  h.runner.device_sampling = true;
  GenerationRequest plain = request(5, nullptr);
  plain.sampling.temperature = 0.0f;
  auto a = *h.engine->submit(plain);
  auto b = *h.engine->submit(request(5, std::make_shared<CycleConstraint>(std::vector<int32_t>{9, 10}, 1000)));
  h.run_checked();
  Collected ca = drain(*a), cb = drain(*b);
  ASSERT_TRUE(ca.finished && cb.finished);
  for (int32_t t : cb.tokens[0]) EXPECT_TRUE(t == 9 || t == 10) << t;
  size_t host = 0, device = 0;
  for (const auto& call : h.runner.sampled_rows)
    for (const runtime::RowSampling& row : call) (row.on_device ? device : host) += 1;
  EXPECT_EQ(host, 5u);    // every row of the constrained request
  EXPECT_EQ(device, 5u);  // the plain request stays on the device
}


// With a runner that masks on the device, constrained rows stay there: the runner asks the engine
// for each row's mask after its forward (RowSampling::mask_source) and the engine accepts the
// device's token into the constraint.
// Greedy rows give the same tokens on both paths (random draws differ: the device keys its RNG
// by seed and step, the host by the sequence's own generator).
TEST(EngineConstraintTest, ConstrainedRowsStayOnADeviceThatMasks) {
  const std::vector<int32_t> allowed = {9, 10, 33, 60};
  std::vector<std::vector<int32_t>> outputs;
  for (bool masking : {false, true}) {
    Harness h(128, 4);
    h.runner.device_sampling = true;
    h.runner.device_masking = masking;
    GenerationRequest r = request(8, std::make_shared<CycleConstraint>(allowed, 1000));
    auto stream = *h.engine->submit(r);
    h.run_checked();
    Collected c = drain(*stream);
    ASSERT_TRUE(c.finished);
    ASSERT_EQ(c.tokens[0].size(), 8u);
    for (int32_t t : c.tokens[0]) EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end()) << t;
    size_t host = 0, device = 0, masked = 0;
    for (const auto& call : h.runner.sampled_rows)
      for (const runtime::RowSampling& row : call) {
        (row.on_device ? device : host) += 1;
        masked += row.mask_source != nullptr ? 1 : 0;
        EXPECT_EQ(row.allowed, nullptr);
      }
    EXPECT_EQ(device, masking ? 8u : 0u);
    EXPECT_EQ(masked, masking ? 8u : 0u);
    EXPECT_EQ(h.runner.num_deferred_masks, masking ? 8 : 0);
    EXPECT_EQ(host, masking ? 0u : 8u);
    outputs.push_back(c.tokens[0]);
    EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
  }
  // Greedy rows pick the same best allowed token on either path.
  std::vector<std::vector<int32_t>> greedy;
  for (bool masking : {false, true}) {
    Harness h(128, 4);
    h.runner.device_sampling = true;
    h.runner.device_masking = masking;
    GenerationRequest r = request(8, std::make_shared<CycleConstraint>(allowed, 1000));
    r.sampling.temperature = 0.0f;
    auto stream = *h.engine->submit(r);
    h.run_checked();
    greedy.push_back(drain(*stream).tokens[0]);
  }
  EXPECT_EQ(greedy[0], greedy[1]);
}

TEST(EngineConstraintTest, ADeviceTokenOutsideTheMaskFailsTheRequest) {
  Harness h(128, 4);
  h.runner.device_sampling = true;
  h.runner.device_masking = true;
  h.runner.ignore_masks = true;  // claims to mask, does not
  GenerationRequest r = request(8, std::make_shared<CycleConstraint>(std::vector<int32_t>{3}, 1000));
  r.sampling.temperature = 0.0f;
  auto stream = *h.engine->submit(r);
  h.run_checked();
  Collected c = drain(*stream);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.error_code, StatusCode::kInternal);
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

TEST(EngineConstraintTest, ADeadEndUnderADeviceThatMasksStillFailsTheRequest) {
  Harness h(128, 4);
  h.runner.device_sampling = true;
  h.runner.device_masking = true;
  auto stream = *h.engine->submit(request(10, std::make_shared<CycleConstraint>(std::vector<int32_t>{5, 6}, 3)));
  GenerationRequest plain = request(6, nullptr);
  plain.sampling.temperature = 0.0f;
  auto neighbour = *h.engine->submit(plain);
  h.run_checked();
  Collected c = drain(*stream);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.tokens[0].size(), 3u);
  EXPECT_EQ(c.error_code, StatusCode::kInternal);
  EXPECT_NE(c.error.find("no token can continue"), std::string::npos) << c.error;
  // The dead end was found while the step ran; the batch it shared goes on.
  Collected n = drain(*neighbour);
  ASSERT_TRUE(n.finished);
  EXPECT_EQ(n.tokens[0].size(), 6u);
  EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
}

// The overlapped path gives every choice the tokens the mask-before-the-step path gave: masks
// asked for after the forward are the same masks, for many constrained rows sharing batches
// with plain ones and with n > 1 forks.
TEST(EngineConstraintTest, DeferredMasksGiveTheTokensOfTheHostPath) {
  std::vector<std::vector<std::vector<int32_t>>> per_path;
  for (bool masking : {false, true}) {
    Harness h(256, 8);
    h.runner.device_sampling = true;
    h.runner.device_masking = masking;
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int32_t i = 0; i < 6; ++i) {
      std::vector<int32_t> allowed = {3 + i, 17, 40 + 2 * i, 63, 60 - i};
      GenerationRequest r = request(10, i == 2 ? nullptr : std::make_shared<CycleConstraint>(allowed, 1000));
      r.sampling.temperature = 0.0f;
      r.prompt_tokens.push_back(i);
      streams.push_back(std::move(*h.engine->submit(r)));
    }
    h.run_checked();
    std::vector<std::vector<int32_t>> outputs;
    for (auto& s : streams) {
      Collected c = drain(*s);
      ASSERT_TRUE(c.finished);
      EXPECT_EQ(c.error_code, StatusCode::kOk) << c.error;
      outputs.push_back(c.tokens[0]);
    }
    EXPECT_EQ(h.runner.num_deferred_masks, masking ? 50 : 0);
    per_path.push_back(outputs);
    EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
  }
  EXPECT_EQ(per_path[0], per_path[1]);
}

// A fixed script of allowed sets, one per output position (free past its end); a position with
// one allowed token is forced, and reported as such when `forcing` (jump-forward).
class ScriptConstraint : public TokenConstraint {
 public:
  ScriptConstraint(std::vector<std::vector<int32_t>> script, bool forcing) : script_(std::move(script)), forcing_(forcing) {}
  size_t fill_allowed(std::span<uint64_t> mask) override {
    for (int32_t t : allowed()) mask[t >> 6] |= uint64_t{1} << (t & 63);
    return allowed().size();
  }
  bool accept(int32_t token) override {
    const auto a = allowed();
    if (std::find(a.begin(), a.end(), token) == a.end()) return false;
    ++position_;
    return true;
  }
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<ScriptConstraint>(*this); }
  void forced_tokens(std::vector<int32_t>& out) override {
    out.clear();
    for (size_t p = position_; forcing_ && p < script_.size() && script_[p].size() == 1; ++p) out.push_back(script_[p][0]);
  }

 private:
  std::vector<int32_t> allowed() const {
    if (position_ < script_.size()) return script_[position_];
    std::vector<int32_t> free;
    for (int32_t t = 1; t < 60; ++t) free.push_back(t);
    return free;
  }
  std::vector<std::vector<int32_t>> script_;
  bool forcing_;
  size_t position_ = 0;
};

// Jump-forward appends the forced tokens without a forward pass each: greedy choices get the
// tokens of the run without it (on the host and on a device that masks), in fewer steps, and
// the engine counts them; requests that report logprobs get no jump-forward.
TEST(EngineConstraintTest, JumpForwardAppendsForcedTokensWithoutAForwardEach) {
  const std::vector<std::vector<int32_t>> script = {{3, 17, 40}, {5}, {6}, {7}, {8, 9, 20}, {11}, {12, 13}, {14}, {15}};
  for (bool device : {false, true}) {
    std::vector<std::vector<int32_t>> outputs;
    std::vector<int64_t> steps, forced;
    for (bool forcing : {false, true}) {
      Harness h(128, 4);
      h.runner.device_sampling = device;
      h.runner.device_masking = device;
      GenerationRequest r = request(14, std::make_shared<ScriptConstraint>(script, forcing));
      r.sampling.temperature = 0.0f;
      r.sampling.n = 2;
      auto stream = *h.engine->submit(r);
      h.run_checked();
      Collected c = drain(*stream, 2);
      ASSERT_TRUE(c.finished);
      EXPECT_EQ(c.error_code, StatusCode::kOk) << c.error;
      ASSERT_EQ(c.tokens[0].size(), 14u);
      EXPECT_EQ(c.tokens[0], c.tokens[1]);
      outputs.push_back(c.tokens[0]);
      steps.push_back(h.engine->stats().steps);
      forced.push_back(h.engine->stats().jump_forward_tokens);
      EXPECT_EQ(h.kv->stats().blocks_in_use, 0);
    }
    EXPECT_EQ(outputs[0], outputs[1]) << "device " << device;
    EXPECT_EQ(forced[0], 0);
    EXPECT_EQ(forced[1], 2 * 6);  // positions 1-3, 5, 7-8 of both choices
    EXPECT_EQ(steps[1], steps[0] - 6) << "device " << device;
  }
  Harness h(128, 4);
  GenerationRequest r = request(8, std::make_shared<ScriptConstraint>(script, true));
  r.sampling.temperature = 0.0f;
  r.sampling.logprobs = 0;
  auto stream = *h.engine->submit(r);
  h.run_checked();
  ASSERT_EQ(drain(*stream).tokens[0].size(), 8u);
  EXPECT_EQ(h.engine->stats().jump_forward_tokens, 0);
}

}  // namespace
}  // namespace pagoda::engine
