#include "pagoda/kv/eviction_policy.h"

#include <algorithm>
#include <utility>

namespace pagoda::kv {
namespace {

// A binary min-heap over (priority, tie) with a position index, so remove() of
// an arbitrary candidate is O(log n). Both policies are this heap with a
// different priority function.
class IndexedHeapPolicy : public EvictionPolicy {
 public:
  void reset(int32_t num_blocks) override {
    heap_.clear();
    position_.assign(static_cast<size_t>(num_blocks), -1);
  }
  void add(const EvictionCandidate& c) override {
    const int32_t i = static_cast<int32_t>(heap_.size());
    heap_.push_back(Node{priority(c), c.last_access_ns, c.block});
    position_[c.block] = i;
    sift_up(i);
  }
  void remove(BlockId block) override {
    if (block < 0 || block >= static_cast<BlockId>(position_.size())) return;
    const int32_t i = position_[block];
    if (i < 0) return;
    erase_at(i);
  }
  std::optional<BlockId> pop_victim() override {
    if (heap_.empty()) return std::nullopt;
    const Node top = heap_[0];
    erase_at(0);
    on_evicted(top.tie);
    return top.block;
  }
  bool contains(BlockId block) const override {
    return block >= 0 && block < static_cast<BlockId>(position_.size()) && position_[block] >= 0;
  }
  int32_t size() const override { return static_cast<int32_t>(heap_.size()); }
  Status verify_integrity() const override {
    for (size_t i = 0; i < heap_.size(); ++i) {
      if (position_[heap_[i].block] != static_cast<int32_t>(i))
        return internal_error("{}: heap slot {} holds block {} but its index says {}", name(), i,
                              heap_[i].block, position_[heap_[i].block]);
      if (i > 0 && less(heap_[i], heap_[(i - 1) / 2]))
        return internal_error("{}: heap order broken at slot {}", name(), i);
    }
    int32_t indexed = 0;
    for (int32_t p : position_) indexed += p >= 0 ? 1 : 0;
    if (indexed != size()) return internal_error("{}: {} indexed, {} in heap", name(), indexed, size());
    return ok_status();
  }

 protected:
  // Lower is evicted first. Called once, when the candidate is added.
  virtual double priority(const EvictionCandidate& c) = 0;
  virtual void on_evicted(uint64_t victim_last_access_ns) {}

 private:
  struct Node {
    double priority;
    uint64_t tie;  // last access: older first among equal priorities
    BlockId block;
  };
  static bool less(const Node& a, const Node& b) {
    if (a.priority != b.priority) return a.priority < b.priority;
    if (a.tie != b.tie) return a.tie < b.tie;
    return a.block < b.block;
  }
  void place(int32_t i, const Node& n) {
    heap_[i] = n;
    position_[n.block] = i;
  }
  void sift_up(int32_t i) {
    const Node n = heap_[i];
    while (i > 0) {
      const int32_t parent = (i - 1) / 2;
      if (!less(n, heap_[parent])) break;
      place(i, heap_[parent]);
      i = parent;
    }
    place(i, n);
  }
  void sift_down(int32_t i) {
    const Node n = heap_[i];
    const int32_t count = static_cast<int32_t>(heap_.size());
    while (true) {
      int32_t child = 2 * i + 1;
      if (child >= count) break;
      if (child + 1 < count && less(heap_[child + 1], heap_[child])) ++child;
      if (!less(heap_[child], n)) break;
      place(i, heap_[child]);
      i = child;
    }
    place(i, n);
  }
  void erase_at(int32_t i) {
    position_[heap_[i].block] = -1;
    const Node last = heap_.back();
    heap_.pop_back();
    if (i == static_cast<int32_t>(heap_.size())) return;
    place(i, last);
    sift_down(i);
    sift_up(position_[last.block]);
  }

  std::vector<Node> heap_;
  std::vector<int32_t> position_;
};

class LruPolicy final : public IndexedHeapPolicy {
 public:
  std::string_view name() const override { return "lru"; }

 protected:
  double priority(const EvictionCandidate& c) override { return static_cast<double>(c.last_access_ns); }
};

class ValueAwarePolicy final : public IndexedHeapPolicy {
 public:
  std::string_view name() const override { return "value_aware"; }
  void reset(int32_t num_blocks) override {
    IndexedHeapPolicy::reset(num_blocks);
    latest_access_ns_ = 0;
    horizon_ns_ = 0.0;
  }

 protected:
  double priority(const EvictionCandidate& c) override {
    latest_access_ns_ = std::max(latest_access_ns_, c.last_access_ns);
    const double branches = std::max<uint32_t>(1, c.branch_count);
    const double value = branches * block_recompute_cost(c.depth, c.block_size) / block_recompute_cost(0, c.block_size);
    return static_cast<double>(c.last_access_ns) + (value - 1.0) * horizon_ns_;
  }
  // The horizon: how long victims had sat unused, as a running average (the
  // latest access among candidates stands in for "now").
  void on_evicted(uint64_t victim_last_access_ns) override {
    const double age = static_cast<double>(latest_access_ns_ - std::min(latest_access_ns_, victim_last_access_ns));
    horizon_ns_ = horizon_ns_ == 0.0 ? age : 0.99 * horizon_ns_ + 0.01 * age;
  }

 private:
  uint64_t latest_access_ns_ = 0;
  double horizon_ns_ = 0.0;
};

}  // namespace

double block_recompute_cost(int32_t depth, int32_t block_size) {
  const double prefix_tokens = static_cast<double>(depth) * block_size;
  return block_size * (1.0 + prefix_tokens / 32768.0);
}

std::string_view eviction_policy_kind_name(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kLru: return "lru";
    case EvictionPolicyKind::kValueAware: return "value_aware";
  }
  return "unknown";
}

std::unique_ptr<EvictionPolicy> make_eviction_policy(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kLru: return std::make_unique<LruPolicy>();
    case EvictionPolicyKind::kValueAware: return std::make_unique<ValueAwarePolicy>();
  }
  return std::make_unique<LruPolicy>();
}

}  // namespace pagoda::kv
