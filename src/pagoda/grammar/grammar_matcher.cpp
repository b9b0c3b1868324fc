#include "pagoda/grammar/grammar_matcher.h"

#include <algorithm>

namespace pagoda::grammar {
namespace {

// Bounds a single expansion; lower_grammar() rejects the grammars that would recurse forever,
// this only caps pathological (exponentially ambiguous) ones.
constexpr int kMaxExpansionDepth = 4096;

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

// The hash a stack's bottom frame chains from.
constexpr uint64_t kRootHash = 0x5A17ull;

uint64_t state_hash_from(uint64_t stack_sum, bool can_end) { return mix(can_end ? 0xC0FFEEull : 0xBEEFull, stack_sum); }

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  for (uint32_t start : grammar_->rules[grammar_->root].alternatives) {
    expand(push(start, 0, -1), state_, 0);
  }
  dedupe(state_);
}

int32_t GrammarMatcher::push(uint32_t element, uint32_t count, int32_t parent) {
  const uint64_t parent_hash = parent >= 0 ? frames_[parent].hash : kRootHash;
  const uint32_t depth = parent >= 0 ? frames_[parent].depth + 1 : 1;
  frames_.push_back({element, count, parent, depth, mix(mix(parent_hash, element), count)});
  return static_cast<int32_t>(frames_.size() - 1);
}

void GrammarMatcher::expand_next(int32_t frame, State& out, int depth) {
  const Frame f = frames_[frame];
  const uint32_t next = f.element + 1;
  if (grammar_->elements[next].kind == ElementKind::kEnd) {
    if (f.parent < 0) {
      out.can_end = true;
    } else {
      expand(f.parent, out, depth + 1);
    }
    return;
  }
  expand(push(next, 0, f.parent), out, depth + 1);
}

void GrammarMatcher::expand(int32_t frame, State& out, int depth) {
  if (depth > kMaxExpansionDepth) return;
  const Frame f = frames_[frame];
  const Element e = grammar_->elements[f.element];
  switch (e.kind) {
    case ElementKind::kBytes:
      out.tops.push_back(frame);
      return;
    case ElementKind::kEnd:
      if (f.parent < 0) {
        out.can_end = true;
      } else {
        expand(f.parent, out, depth + 1);
      }
      return;
    case ElementKind::kRule: {
      // The return address; a reference that ends its alternative returns straight to the parent.
      int32_t ret = f.parent;
      if (grammar_->elements[f.element + 1].kind != ElementKind::kEnd) ret = push(f.element + 1, 0, f.parent);
      for (uint32_t start : grammar_->rules[e.index].alternatives) expand(push(start, 0, ret), out, depth + 1);
      return;
    }
    case ElementKind::kRepeat: {
      if (e.max == kUnbounded || f.count < e.max) {
        // Unbounded counts stop at `min`: past it every count behaves the same.
        const uint32_t next_count = e.max == kUnbounded ? std::min(f.count + 1, e.min) : f.count + 1;
        const int32_t ret = push(f.element, next_count, f.parent);
        for (uint32_t start : grammar_->rules[e.index].alternatives) expand(push(start, 0, ret), out, depth + 1);
      }
      if (f.count >= e.min) expand_next(frame, out, depth);
      return;
    }
  }
}

bool GrammarMatcher::same_stack(int32_t a, int32_t b) const {
  while (a >= 0 && b >= 0) {
    if (a == b) return true;
    const Frame& fa = frames_[a];
    const Frame& fb = frames_[b];
    if (fa.element != fb.element || fa.count != fb.count || fa.hash != fb.hash) return false;
    a = fa.parent;
    b = fb.parent;
  }
  return a == b;
}

void GrammarMatcher::dedupe(State& state) const {
  auto& tops = state.tops;
  if (tops.size() < 2) return;
  std::sort(tops.begin(), tops.end(), [&](int32_t a, int32_t b) {
    return frames_[a].hash < frames_[b].hash || (frames_[a].hash == frames_[b].hash && a < b);
  });
  size_t kept = 0;
  for (size_t i = 0; i < tops.size(); ++i) {
    bool duplicate = false;
    for (size_t j = kept; j-- > 0 && frames_[tops[j]].hash == frames_[tops[i]].hash;) {
      if (same_stack(tops[j], tops[i])) {
        duplicate = true;
        break;
      }
    }
    if (!duplicate) tops[kept++] = tops[i];
  }
  tops.resize(kept);
}

void GrammarMatcher::advance(const State& from, uint8_t byte, State& out) {
  out.tops.clear();
  out.can_end = false;
  for (int32_t top : from.tops) {
    const Element& e = grammar_->elements[frames_[top].element];
    if (grammar_->byte_sets[e.index].test(byte)) expand_next(top, out, 0);
  }
  dedupe(out);
}

bool GrammarMatcher::accept(std::string_view bytes) {
  if (bytes.empty()) return true;
  const size_t start_mark = mark();
  State current = state_;
  for (char c : bytes) {
    advance(current, static_cast<uint8_t>(c), scratch_);
    if (scratch_.dead()) {
      rollback(start_mark);
      return false;
    }
    std::swap(current, scratch_);
  }
  state_ = std::move(current);
  return true;
}

void GrammarMatcher::compact() {
  std::vector<int32_t> remap(frames_.size(), -1);
  std::vector<Frame> kept;
  // Parents come before children in the arena, so one ordered pass over the reachable frames
  // keeps that order.
  std::vector<char> reachable(frames_.size(), 0);
  for (int32_t top : state_.tops)
    for (int32_t f = top; f >= 0 && !reachable[f]; f = frames_[f].parent) reachable[f] = 1;
  for (size_t i = 0; i < frames_.size(); ++i) {
    if (!reachable[i]) continue;
    Frame f = frames_[i];
    f.parent = f.parent >= 0 ? remap[f.parent] : -1;
    remap[i] = static_cast<int32_t>(kept.size());
    kept.push_back(f);
  }
  for (int32_t& top : state_.tops) top = remap[top];
  frames_ = std::move(kept);
}

// A state's hash: the sum (order-free: stacks are distinct) of its stacks' hashes, each the
// hash its top frame carries (push(): a chain from the bottom frame up) mixed with its depth.
uint64_t GrammarMatcher::StateImage::hash() const {
  uint64_t sum = 0;
  for (const auto& stack : stacks) {
    uint64_t h = kRootHash;
    for (size_t i = stack.size(); i-- > 0;) h = mix(mix(h, stack[i] >> 32), stack[i] & 0xFFFFFFFFu);
    sum += mix(h, stack.size());
  }
  return state_hash_from(sum, can_end);
}

uint64_t GrammarMatcher::hash_of(const State& state) const {
  uint64_t sum = 0;
  for (int32_t top : state.tops) sum += mix(frames_[top].hash, frames_[top].depth);
  return state_hash_from(sum, state.can_end);
}

bool GrammarMatcher::same_state(const State& state, const StateImage& image) const {
  if (state.can_end != image.can_end || state.tops.size() != image.stacks.size()) return false;
  // Stacks are distinct on both sides, so a one-to-one match is a containment check.
  for (int32_t top : state.tops) {
    bool found = false;
    for (const auto& stack : image.stacks) {
      size_t i = 0;
      int32_t f = top;
      for (; f >= 0 && i < stack.size(); f = frames_[f].parent, ++i)
        if (stack[i] != ((uint64_t{frames_[f].element} << 32) | frames_[f].count)) break;
      if (f < 0 && i == stack.size()) {
        found = true;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

GrammarMatcher::StateImage GrammarMatcher::image_of(const State& state) const {
  StateImage image;
  image.can_end = state.can_end;
  image.stacks.reserve(state.tops.size());
  for (int32_t top : state.tops) {
    std::vector<uint64_t> stack;
    for (int32_t f = top; f >= 0; f = frames_[f].parent)
      stack.push_back((uint64_t{frames_[f].element} << 32) | frames_[f].count);
    image.stacks.push_back(std::move(stack));
  }
  std::sort(image.stacks.begin(), image.stacks.end());
  return image;
}

void GrammarMatcher::load_for_byte(const StateImage& image, uint8_t byte) {
  frames_.clear();
  state_.tops.clear();
  state_.can_end = false;
  for (const auto& stack : image.stacks) {
    if (stack.empty()) continue;
    const Element& top = grammar_->elements[static_cast<size_t>(stack[0] >> 32)];
    if (!grammar_->byte_sets[top.index].test(byte)) continue;
    int32_t parent = -1;
    for (size_t i = stack.size(); i-- > 0;) {
      parent = push(static_cast<uint32_t>(stack[i] >> 32), static_cast<uint32_t>(stack[i] & 0xFFFFFFFFu), parent);
    }
    state_.tops.push_back(parent);
  }
}

void GrammarMatcher::load(const StateImage& image) {
  frames_.clear();
  state_.tops.clear();
  state_.can_end = image.can_end;
  for (const auto& stack : image.stacks) {
    int32_t parent = -1;
    for (size_t i = stack.size(); i-- > 0;) {
      parent = push(static_cast<uint32_t>(stack[i] >> 32), static_cast<uint32_t>(stack[i] & 0xFFFFFFFFu), parent);
    }
    if (parent >= 0) state_.tops.push_back(parent);
  }
}

}  // namespace pagoda::grammar
