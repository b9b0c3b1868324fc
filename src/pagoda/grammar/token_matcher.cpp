#include "pagoda/grammar/token_matcher.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>

namespace pagoda::grammar {

namespace {

// Window sizes tried in turn (frames from the top of a stack); past the last, the whole stack.
constexpr size_t kWindowFrames[] = {4, 8, 16};
// precompute() computes the windows of every count of a bounded repetition up to this many
// (and does not walk on from the states past its second repetition).
constexpr uint32_t kMaxSiblingCount = 64;
// A window set's union of accepted tokens is kept when it ORs two mask windows or sets this many
// ids (cheaper ones are recomputed).
constexpr size_t kCostlyUnionIds = 1024;

void set_bit(std::span<uint64_t> mask, int32_t id) { mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); }
bool test_bit(std::span<const uint64_t> mask, int32_t id) { return (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; }

// Set bits of `words`. std::popcount compiles to a library call without -mpopcnt (the default
// x86-64 target), ~4 ns a word: the whole cost of a cached mask. The POPCNT instruction is
// chosen once at run time where the CPU has it.
size_t count_bits_portable(std::span<const uint64_t> words) {
  size_t n = 0;
  for (uint64_t w : words) n += static_cast<size_t>(std::popcount(w));
  return n;
}
#if defined(__x86_64__)
__attribute__((target("popcnt"))) size_t count_bits_popcnt(std::span<const uint64_t> words) {
  size_t n = 0;
  for (uint64_t w : words) n += static_cast<size_t>(__builtin_popcountll(w));
  return n;
}
size_t count_bits(std::span<const uint64_t> words) {
  static const bool has_popcnt = __builtin_cpu_supports("popcnt");
  return has_popcnt ? count_bits_popcnt(words) : count_bits_portable(words);
}
#else
size_t count_bits(std::span<const uint64_t> words) { return count_bits_portable(words); }
#endif

// dst |= src over n words. The plain loop is not vectorized at -O2 (its pointers may alias), and a
// state with several mask windows ORs ~2,400 words per window: AVX2 where the CPU has it.
void or_words_portable(uint64_t* __restrict dst, const uint64_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] |= src[i];
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) void or_words_avx2(uint64_t* __restrict dst, const uint64_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] |= src[i];
}
void or_words(uint64_t* dst, const uint64_t* src, size_t n) {
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  if (has_avx2) {
    or_words_avx2(dst, src, n);
  } else {
    or_words_portable(dst, src, n);
  }
}
#else
void or_words(uint64_t* dst, const uint64_t* src, size_t n) { or_words_portable(dst, src, n); }
#endif

// Per rule: the bytes that may come first in it, and the bytes that may come right after it
// completes, wherever the grammar references it (an over-approximation: every context at once).
struct RuleBytes {
  std::vector<ByteSet> first, follow;
  std::vector<uint32_t> rule_of_element;
};

bool or_into(ByteSet& dst, const ByteSet& src) {
  bool changed = false;
  for (size_t w = 0; w < dst.bits.size(); ++w) {
    const uint64_t merged = dst.bits[w] | src.bits[w];
    changed = changed || merged != dst.bits[w];
    dst.bits[w] = merged;
  }
  return changed;
}

RuleBytes rule_bytes(const Grammar& g) {
  RuleBytes out;
  out.first.assign(g.rules.size(), ByteSet{});
  out.follow.assign(g.rules.size(), ByteSet{});
  out.rule_of_element.assign(g.elements.size(), 0);
  for (uint32_t r = 0; r < g.rules.size(); ++r)
    for (uint32_t start : g.rules[r].alternatives)
      for (uint32_t k = start; k < g.elements.size(); ++k) {
        out.rule_of_element[k] = r;
        if (g.elements[k].kind == ElementKind::kEnd) break;
      }
  // The first bytes of the elements from `k` to the end of its alternative into `acc`; true when
  // they can all match nothing (the alternative's end is reachable without a byte).
  auto first_of = [&](uint32_t k, ByteSet& acc) {
    for (; k < g.elements.size(); ++k) {
      const Element& e = g.elements[k];
      switch (e.kind) {
        case ElementKind::kEnd:
          return true;
        case ElementKind::kBytes:
          or_into(acc, g.byte_sets[e.index]);
          return false;
        case ElementKind::kRule:
          or_into(acc, out.first[e.index]);
          if (!g.rules[e.index].nullable) return false;
          break;
        case ElementKind::kRepeat:
          or_into(acc, out.first[e.index]);
          if (e.min > 0 && !g.rules[e.index].nullable) return false;
          break;
      }
    }
    return true;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < g.rules.size(); ++r)
      for (uint32_t start : g.rules[r].alternatives) {
        ByteSet acc = out.first[r];
        (void)first_of(start, acc);
        changed = or_into(out.first[r], acc) || changed;
      }
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t x = 0; x < g.elements.size(); ++x) {
      const Element& e = g.elements[x];
      if (e.kind != ElementKind::kRule && e.kind != ElementKind::kRepeat) continue;
      ByteSet acc = out.follow[e.index];
      if (e.kind == ElementKind::kRepeat) or_into(acc, out.first[e.index]);  // another round
      if (first_of(x + 1, acc)) or_into(acc, out.follow[out.rule_of_element[x]]);
      changed = or_into(out.follow[e.index], acc) || changed;
    }
  }
  return out;
}

CompiledGrammar::Limits with_a_table(CompiledGrammar::Limits limits) {
  limits.max_tables = std::max<size_t>(limits.max_tables, 1);
  return limits;
}

}  // namespace

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> grammar,
                                 std::shared_ptr<const TokenVocabulary> vocabulary, Limits limits)
    : grammar_(std::move(grammar)),
      vocabulary_(std::move(vocabulary)),
      limits_(with_a_table(limits)),
      scratch_(grammar_) {
  // Classes by the set of byte sets a byte belongs to.
  const size_t num_sets = grammar_->byte_sets.size();
  std::map<std::vector<bool>, uint8_t> classes;
  for (unsigned b = 0; b < 256; ++b) {
    std::vector<bool> signature(num_sets);
    for (size_t i = 0; i < num_sets; ++i) signature[i] = grammar_->byte_sets[i].test(static_cast<uint8_t>(b));
    auto [it, added] = classes.emplace(std::move(signature), static_cast<uint8_t>(class_byte_.size()));
    if (added) class_byte_.push_back(static_cast<uint8_t>(b));
    byte_class_[b] = it->second;
  }
  RuleBytes bytes = rule_bytes(*grammar_);
  follow_ = std::move(bytes.follow);
  rule_of_element_ = std::move(bytes.rule_of_element);
  std::lock_guard lock(mutex_);
  initial_ = intern_locked(scratch_.image());
}

MaskStats CompiledGrammar::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

size_t CompiledGrammar::memory_bytes() const {
  std::lock_guard lock(mutex_);
  // Node-based containers: an entry's node plus about two pointers of bucket and allocator.
  constexpr size_t kNode = 32;
  return state_bytes_ + (states_.capacity() - states_.size()) * sizeof(StateInfo) +
         unions_.size() * (vocabulary_->mask_words() * sizeof(uint64_t) + sizeof(WindowUnion) + kNode) +
         tables_ * class_byte_.size() * sizeof(int32_t) +
         mask_lru_.size() * (vocabulary_->mask_words() * sizeof(uint64_t) + kNode) + window_bytes_ +
         windows_.size() * (sizeof(Window) + kNode);
}

int32_t CompiledGrammar::intern_locked(GrammarMatcher::StateImage image) {
  const uint64_t hash = image.hash();
  auto [begin, end] = state_index_.equal_range(hash);
  for (auto it = begin; it != end; ++it)
    if (states_[it->second].image == image) return it->second;
  const int32_t id = static_cast<int32_t>(states_.size());
  StateInfo info;
  info.has_tops = !image.stacks.empty();
  state_bytes_ += sizeof(StateInfo) + 32 + image.stacks.capacity() * sizeof(std::vector<uint64_t>);
  for (const auto& stack : image.stacks) state_bytes_ += stack.capacity() * sizeof(uint64_t);
  info.image = std::move(image);
  states_.push_back(std::move(info));
  state_index_.emplace(hash, id);
  ++stats_.states;
  return id;
}

int32_t CompiledGrammar::step_locked(int32_t state, uint8_t byte) {
  if (!states_[state].has_tops) return kDead;
  if (!states_[state].next) {
    if (tables_ >= limits_.max_tables) {
      for (StateInfo& s : states_) s.next.reset();
      tables_ = 0;
    }
    states_[state].next = std::make_unique<int32_t[]>(class_byte_.size());
    std::fill_n(states_[state].next.get(), class_byte_.size(), kUnknown);
    ++tables_;
  }
  const uint8_t byte_class = byte_class_[byte];
  const int32_t known = states_[state].next[byte_class];
  if (known != kUnknown) return known;
  // Consecutive steps from one state (a breadth-first visit) load it once; otherwise only the
  // stacks that accept the byte are loaded (a value position has a dozen stacks, deep ones in
  // nested JSON, and a byte such as '"' continues one or two of them).
  if (loaded_state_ == state) {
    scratch_.rollback(loaded_mark_);
  } else if (load_whole_states_) {
    scratch_.load(states_[state].image);
    loaded_state_ = state;
    loaded_mark_ = scratch_.mark();
  } else {
    scratch_.load_for_byte(states_[state].image, byte);
    loaded_state_ = -1;
  }
  GrammarMatcher::State& out = step_out_;
  scratch_.advance(scratch_.state(), byte, out);
  int32_t result = kDead;
  if (!out.dead()) {
    // Most transitions lead to a known state: find it without building its image.
    const uint64_t hash = scratch_.hash_of(out);
    auto [begin, end] = state_index_.equal_range(hash);
    for (auto it = begin; it != end && result == kDead; ++it)
      if (scratch_.same_state(out, states_[it->second].image)) result = it->second;
    if (result == kDead) result = intern_locked(scratch_.image_of(out));
  }
  states_[state].next[byte_class] = result;  // states_ may have grown: index again
  ++stats_.transitions_computed;
  return result;
}

void CompiledGrammar::walk_trie_locked(int32_t state, std::span<uint64_t> mask) {
  const TokenVocabulary& vocab = *vocabulary_;
  walk_states_.assign(static_cast<size_t>(vocab.max_depth()) + 1, kDead);
  walk_states_[0] = state;
  const size_t n = vocab.num_nodes();
  uint64_t visited = 0;
  for (size_t i = 0; i < n;) {
    ++visited;
    const size_t depth = vocab.node_depth(i);
    const int32_t next = step_locked(walk_states_[depth - 1], vocab.node_byte(i));
    if (next == kDead) {
      i = vocab.subtree_end(i);
      continue;
    }
    walk_states_[depth] = next;
    for (int32_t id : vocab.node_tokens(i)) set_bit(mask, id);
    i = states_[next].has_tops ? i + 1 : vocab.subtree_end(i);
  }
  stats_.trie_nodes_visited += visited;
}

// The trie walk of a window's frames: `local_state` is the window alone, so a path that returns
// below its bottom frame shows as can_end (when `cut`: the rest of the stack decides what may
// follow; otherwise the window is the whole stack and that is the grammar's real end).
void CompiledGrammar::compute_window_locked(int32_t local_state, bool cut, Window& window) {
  const TokenVocabulary& vocab = *vocabulary_;
  std::vector<uint64_t>& accepted = window_scratch_;
  accepted.assign(vocab.mask_words(), 0);
  window.uncertain.clear();
  window.too_uncertain = false;
  ++stats_.windows;
  walk_states_.assign(static_cast<size_t>(vocab.max_depth()) + 1, kDead);
  walk_escaped_.assign(static_cast<size_t>(vocab.max_depth()) + 1, 0);
  walk_fresh_.assign(static_cast<size_t>(vocab.max_depth()) + 1, 0);
  walk_states_[0] = local_state;
  // A path that returns below the window (the bottom frame's rule completes) goes on, in any
  // context, with a byte that may follow that rule somewhere in the grammar: a token whose next
  // byte may not is rejected whatever lies below. Past that first byte nothing is known.
  // walk_fresh_[d]: a path returned below at depth d; walk_escaped_[d]: a returned path may be
  // alive past its first byte.
  const ByteSet& follow = follow_[rule_of_element_[static_cast<size_t>(window.frames.back() >> 32)]];
  auto escaped_through = [&](size_t parent_depth, uint8_t byte) {
    return walk_escaped_[parent_depth] || (walk_fresh_[parent_depth] && follow.test(byte));
  };
  const size_t n = vocab.num_nodes();
  uint64_t visited = 0;
  // Every token of the node range [begin, end) depends on the frames below the window.
  auto all_uncertain = [&](size_t begin, size_t end) {
    for (size_t j = begin; j < end && !window.too_uncertain; ++j) {
      const auto ids = vocab.node_tokens(j);
      window.uncertain.insert(window.uncertain.end(), ids.begin(), ids.end());
      if (window.uncertain.size() > limits_.max_uncertain) window.too_uncertain = true;
    }
  };
  for (size_t i = 0; i < n && !window.too_uncertain;) {
    ++visited;
    const size_t depth = vocab.node_depth(i);
    const int32_t next = step_locked(walk_states_[depth - 1], vocab.node_byte(i));
    if (next == kDead) {
      if (cut && escaped_through(depth - 1, vocab.node_byte(i))) all_uncertain(i, vocab.subtree_end(i));
      i = vocab.subtree_end(i);
      continue;
    }
    walk_states_[depth] = next;
    walk_escaped_[depth] = cut && escaped_through(depth - 1, vocab.node_byte(i));
    walk_fresh_[depth] = cut && states_[next].image.can_end;
    for (int32_t id : vocab.node_tokens(i)) set_bit(accepted, id);
    if (states_[next].has_tops) {
      ++i;
      continue;
    }
    if (walk_escaped_[depth] || walk_fresh_[depth]) {
      for (size_t child = i + 1; child < vocab.subtree_end(i); child = vocab.subtree_end(child))
        if (escaped_through(depth, vocab.node_byte(child))) all_uncertain(child, vocab.subtree_end(child));
    }
    i = vocab.subtree_end(i);
  }
  stats_.trie_nodes_visited += visited;
  if (window.too_uncertain) {
    window.uncertain = {};
    return;
  }
  window.uncertain.shrink_to_fit();
  const size_t count = count_bits(accepted);
  if (count * 2 >= accepted.size()) {
    window.accepted_bits = accepted;
    return;
  }
  window.accepted_ids.reserve(count);
  for (size_t w = 0; w < accepted.size(); ++w)
    for (uint64_t bits = accepted[w]; bits != 0; bits &= bits - 1)
      window.accepted_ids.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(std::countr_zero(bits))));
}

const CompiledGrammar::Window* CompiledGrammar::window_for_locked(const std::vector<uint64_t>& stack) {
  for (size_t k = 0; k <= std::size(kWindowFrames); ++k) {
    const bool cut = k < std::size(kWindowFrames) && stack.size() > kWindowFrames[k];
    const std::span<const uint64_t> frames(stack.data(), cut ? kWindowFrames[k] : stack.size());
    uint64_t key = cut ? 0x9E3779B97F4A7C15ull : 0x2545F4914F6CDD1Dull;
    for (uint64_t word : frames) key = (key ^ word) * 0xBF58476D1CE4E5B9ull + (key >> 29);
    const Window* found = nullptr;
    auto [begin, end] = windows_.equal_range(key);
    for (auto it = begin; it != end && found == nullptr; ++it)
      if (it->second.cut == cut && std::ranges::equal(it->second.frames, frames)) found = &it->second;
    if (found == nullptr) {
      if (windows_.size() >= limits_.max_windows || window_bytes_ >= limits_.max_window_bytes) return nullptr;
      // `stack` may live in states_, which interning can move: nothing reads it past here.
      Window window;
      window.frames.assign(frames.begin(), frames.end());
      window.cut = cut;
      GrammarMatcher::StateImage image;
      image.stacks.push_back(window.frames);
      compute_window_locked(intern_locked(std::move(image)), cut, window);
      window_bytes_ += window.bytes();
      stats_.window_bytes = window_bytes_;
      found = &windows_.emplace(key, std::move(window))->second;
    }
    if (!found->too_uncertain) return found;
    if (!cut) return nullptr;  // cannot happen: a whole stack has no uncertain tokens
  }
  return nullptr;
}

int CompiledGrammar::forced_byte_locked(int32_t state) {
  StateInfo& info = states_[state];
  if (info.forced != -2) return info.forced;
  info.forced = -1;
  if (info.image.can_end || !info.has_tops) return -1;
  // Every top is a byte terminal (grammar_matcher.h): the union of their sets is what may follow.
  ByteSet next;
  for (const auto& stack : info.image.stacks) {
    const Element& e = grammar_->elements[static_cast<size_t>(stack[0] >> 32)];
    for (size_t w = 0; w < next.bits.size(); ++w) next.bits[w] |= grammar_->byte_sets[e.index].bits[w];
  }
  if (count_bits(next.bits) != 1) return -1;
  for (size_t w = 0; w < next.bits.size(); ++w)
    if (next.bits[w] != 0) info.forced = static_cast<int16_t>(w * 64 + static_cast<size_t>(std::countr_zero(next.bits[w])));
  return info.forced;
}

void CompiledGrammar::check_uncertain_locked(int32_t state, const std::vector<int32_t>& ids, std::span<uint64_t> mask) {
  const TokenVocabulary& vocab = *vocabulary_;
  // Consecutive ids share their common prefix's states (they are in trie order).
  walk_states_.resize(static_cast<size_t>(vocab.max_depth()) + 1);
  walk_states_[0] = state;
  size_t known = 0;  // walk_states_[0..known] hold the states along `previous`
  std::string_view previous;
  for (int32_t id : ids) {
    if (test_bit(mask, id)) continue;
    ++stats_.uncertain_checked;
    const std::string_view bytes = vocab.bytes(id);
    size_t d = 0;
    while (d < known && d < bytes.size() && bytes[d] == previous[d]) ++d;
    int32_t s = walk_states_[d];
    while (s != kDead && d < bytes.size()) {
      s = step_locked(s, static_cast<uint8_t>(bytes[d]));
      walk_states_[++d] = s;
    }
    known = d;
    previous = bytes;
    if (s != kDead && d == bytes.size()) set_bit(mask, id);
  }
}

void CompiledGrammar::accepted_union_locked(const std::vector<const Window*>& windows, std::span<uint64_t> mask) {
  const size_t words = vocabulary_->mask_words();
  std::vector<const Window*>& key = union_key_;
  key.assign(windows.begin(), windows.end());
  std::sort(key.begin(), key.end());
  key.erase(std::unique(key.begin(), key.end()), key.end());
  size_t bit_windows = 0, ids = 0;
  uint64_t hash = 0x51ED270B27E1B6B5ull;
  for (const Window* w : key) {
    bit_windows += !w->accepted_bits.empty();
    ids += w->accepted_ids.size();
    hash = (hash ^ reinterpret_cast<uintptr_t>(w)) * 0x9E3779B97F4A7C15ull + (hash >> 31);
  }
  const bool costly = bit_windows >= 2 || ids >= kCostlyUnionIds;
  if (costly) {
    auto [begin, end] = unions_.equal_range(hash);
    for (auto it = begin; it != end; ++it) {
      if (it->second.windows != key) continue;
      std::memcpy(mask.data(), it->second.bits.data(), words * sizeof(uint64_t));
      ++stats_.union_hits;
      return;
    }
  }
  // The first mask window is copied, the others ORed.
  bool started = false;
  for (const Window* w : key) {
    if (w->accepted_bits.empty()) continue;
    if (started) {
      or_words(mask.data(), w->accepted_bits.data(), words);
    } else {
      std::memcpy(mask.data(), w->accepted_bits.data(), words * sizeof(uint64_t));
      started = true;
    }
  }
  if (!started) std::fill(mask.begin(), mask.begin() + static_cast<std::ptrdiff_t>(words), 0);
  for (const Window* w : key)
    for (int32_t id : w->accepted_ids) set_bit(mask, id);
  if (costly && unions_.size() < limits_.max_window_unions) {
    WindowUnion& u = unions_.emplace(hash, WindowUnion{})->second;
    u.windows = key;
    u.bits.assign(mask.begin(), mask.begin() + static_cast<std::ptrdiff_t>(words));
  }
}

bool CompiledGrammar::compose_mask_locked(int32_t state, std::span<uint64_t> mask) {
  const size_t words = vocabulary_->mask_words();
  // Indexed each time: computing a window interns states, which may move states_.
  const size_t num_stacks = states_[state].image.stacks.size();
  std::vector<const Window*>& windows = compose_windows_;
  windows.clear();
  stats_.stacks_composed += num_stacks;
  for (size_t i = 0; i < num_stacks; ++i) {
    const Window* w = window_for_locked(states_[state].image.stacks[i]);
    if (w == nullptr) return false;
    windows.push_back(w);  // stable: windows_ is node-based
  }
  accepted_union_locked(windows, mask);
  for (const Window* w : windows) check_uncertain_locked(state, w->uncertain, mask);
  return true;
}

void CompiledGrammar::fill_mask_locked(int32_t state, std::span<uint64_t> mask) {
  const size_t words = vocabulary_->mask_words();
  if (!states_[state].mask.empty()) {
    std::memcpy(mask.data(), states_[state].mask.data(), words * sizeof(uint64_t));
    mask_lru_.splice(mask_lru_.begin(), mask_lru_, states_[state].mask_lru);
    ++stats_.hits;
    return;
  }
  ++stats_.misses;
  if (!compose_mask_locked(state, mask)) {
    ++stats_.whole_walks;
    std::fill(mask.begin(), mask.begin() + static_cast<std::ptrdiff_t>(words), 0);
    walk_trie_locked(state, mask);
  }
  if (states_[state].image.can_end) {
    for (int32_t id : vocabulary_->end_ids()) set_bit(mask, id);
  }
  if (limits_.max_cached_masks == 0) return;
  StateInfo& info = states_[state];
  info.mask.assign(mask.begin(), mask.begin() + static_cast<std::ptrdiff_t>(words));
  mask_lru_.push_front(state);
  info.mask_lru = mask_lru_.begin();
  while (mask_lru_.size() > limits_.max_cached_masks) {
    StateInfo& old = states_[mask_lru_.back()];
    old.mask.clear();
    old.mask.shrink_to_fit();
    mask_lru_.pop_back();
  }
}

bool CompiledGrammar::repeats_again_locked(int32_t state) const {
  for (const auto& stack : states_[state].image.stacks) {
    const size_t top = std::min(stack.size(), kWindowFrames[std::size(kWindowFrames) - 1]);
    for (size_t f = 0; f < top; ++f) {
      const Element& e = grammar_->elements[static_cast<size_t>(stack[f] >> 32)];
      if (e.kind == ElementKind::kRepeat && e.max != kUnbounded && e.max <= kMaxSiblingCount && (stack[f] & 0xFFFFFFFFu) >= 2)
        return true;
    }
  }
  return false;
}

PrecomputeStats CompiledGrammar::precompute(size_t max_states, double max_seconds) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::lock_guard lock(mutex_);
  PrecomputeStats out;
  const uint64_t windows_before = stats_.windows;
  load_whole_states_ = true;  // every byte class is stepped from each state in turn
  std::vector<int32_t> queue = {initial_};
  std::unordered_map<int32_t, char> seen = {{initial_, 1}};
  // States past the second round of a bounded repetition wait until nothing else is left: the
  // count siblings below give their windows, and an unbounded grammar's budget goes further in.
  std::vector<int32_t> deferred;
  size_t head = 0;
  for (;; ++head) {
    if (head == queue.size()) {
      if (deferred.empty()) break;
      queue.insert(queue.end(), deferred.begin(), deferred.end());
      deferred.clear();
    }
    if (out.states >= max_states || elapsed() > max_seconds * 0.7 || windows_.size() >= limits_.max_windows ||
        window_bytes_ >= limits_.max_window_bytes)
      break;
    const int32_t state = queue[head];
    ++out.states;
    // The state's windows, and the union of their accepted tokens when it costs enough to keep
    // (a JSON value position ORs several mask windows; at other depths the same windows recur).
    compose_windows_.clear();
    for (size_t i = 0; i < states_[state].image.stacks.size(); ++i) {
      const Window* w = window_for_locked(states_[state].image.stacks[i]);
      if (w != nullptr) compose_windows_.push_back(w);
    }
    if (compose_windows_.size() > 1 && unions_.size() < limits_.max_window_unions) {
      union_scratch_.resize(vocabulary_->mask_words());
      accepted_union_locked(compose_windows_, union_scratch_);
    }
    if (!states_[state].has_tops) continue;
    for (uint8_t b : class_byte_) {
      const int32_t next = step_locked(state, b);
      if (next != kDead && seen.emplace(next, 1).second) (repeats_again_locked(next) ? deferred : queue).push_back(next);
    }
  }
  load_whole_states_ = false;
  out.complete = head == queue.size() && deferred.empty();
  // A bounded repetition (the indentation of JSON whitespace, up to 20 blanks) gives every
  // count its own frames, so the walk above meets the windows of a few counts only where the
  // state space is wide (json_object). The windows of the other counts at the same place follow
  // from the stacks met: the same frames with the first such count replaced.
  if (!out.complete) {
    std::vector<uint64_t> sibling;
    for (size_t i = 0; i < head; ++i) {
      const size_t num_stacks = states_[queue[i]].image.stacks.size();
      for (size_t j = 0; j < num_stacks; ++j) {
        if (elapsed() > max_seconds || windows_.size() >= limits_.max_windows ||
            window_bytes_ >= limits_.max_window_bytes)
          break;
        sibling = states_[queue[i]].image.stacks[j];
        const size_t top = std::min(sibling.size(), kWindowFrames[std::size(kWindowFrames) - 1]);
        for (size_t f = 0; f < top; ++f) {
          const Element& e = grammar_->elements[static_cast<size_t>(sibling[f] >> 32)];
          if (e.kind != ElementKind::kRepeat || e.max == kUnbounded || e.max > kMaxSiblingCount) continue;
          const uint64_t count = sibling[f] & 0xFFFFFFFFu;
          for (uint64_t c = 1; c <= e.max; ++c) {
            if (c == count) continue;
            sibling[f] = (sibling[f] & ~uint64_t{0xFFFFFFFFu}) | c;
            (void)window_for_locked(sibling);
          }
          ++out.count_siblings;
          break;
        }
      }
    }
  }
  // Room for several times the states met so far before the state vector grows or the index
  // rehashes (either moves every entry: a spike in whichever mask interns the state that
  // triggers it).
  const size_t room = std::max<size_t>(states_.size() * 4, 4096);
  states_.reserve(room);
  state_index_.reserve(room);
  out.windows = stats_.windows - windows_before;
  out.seconds = elapsed();
  return out;
}

TokenMatcher::TokenMatcher(std::shared_ptr<CompiledGrammar> compiled) : compiled_(std::move(compiled)) {
  std::lock_guard lock(compiled_->mutex_);
  state_ = compiled_->initial_;
}

size_t TokenMatcher::fill_mask(std::span<uint64_t> mask) {
  const size_t words = mask_words();
  if (mask.size() < words) return 0;
  std::fill(mask.begin() + static_cast<std::ptrdiff_t>(words), mask.end(), 0);
  if (finished_) {
    std::fill(mask.begin(), mask.end(), 0);
    for (int32_t id : compiled_->vocabulary().end_ids()) set_bit(mask, id);
  } else {
    std::lock_guard lock(compiled_->mutex_);
    compiled_->fill_mask_locked(state_, mask);
  }
  return count_bits(mask.first(words));
}

bool TokenMatcher::accept(int32_t token) {
  const TokenVocabulary& vocab = compiled_->vocabulary();
  if (token < 0 || token >= vocab.size()) return false;
  if (finished_) return vocab.is_end(token);  // ignore_eos requests go on emitting end ids
  if (vocab.is_end(token)) {
    if (!is_complete()) return false;
    finished_ = true;
    return true;
  }
  const std::string_view bytes = vocab.bytes(token);
  if (bytes.empty()) return false;
  return accept_text(bytes);
}

bool TokenMatcher::accept_text(std::string_view bytes) {
  if (finished_) return false;
  std::lock_guard lock(compiled_->mutex_);
  int32_t s = state_;
  for (char c : bytes) {
    s = compiled_->step_locked(s, static_cast<uint8_t>(c));
    if (s == CompiledGrammar::kDead) return false;
  }
  state_ = s;
  return true;
}

std::string TokenMatcher::forced_text(size_t max_bytes) const {
  std::string text;
  if (finished_) return text;
  std::lock_guard lock(compiled_->mutex_);
  int32_t s = state_;
  while (text.size() < max_bytes) {
    const int byte = compiled_->forced_byte_locked(s);
    if (byte < 0) break;
    s = compiled_->step_locked(s, static_cast<uint8_t>(byte));
    if (s == CompiledGrammar::kDead) break;  // cannot happen: the byte is allowed
    text.push_back(static_cast<char>(byte));
  }
  return text;
}

bool TokenMatcher::is_complete() const {
  std::lock_guard lock(compiled_->mutex_);
  return compiled_->states_[state_].image.can_end;
}

}  // namespace pagoda::grammar
