#include "pagoda/eval/recall.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace pagoda::eval {

StatusOr<RecallResult> evaluate_recall(PagedRunner& runner, const RecallSpec& spec,
                                       const ProgressCallback& progress) {
  if (spec.intro.empty()) return invalid_argument_error("recall: the list's introduction is empty");
  if (spec.list_words < 1 || static_cast<int32_t>(spec.words.size()) < spec.list_words)
    return invalid_argument_error("recall: {} candidate words for lists of {}", spec.words.size(), spec.list_words);
  if (static_cast<int64_t>(spec.filler.size()) < spec.context_tokens)
    return invalid_argument_error("recall: {} filler tokens for a context of {}", spec.filler.size(),
                                  spec.context_tokens);
  if (spec.trials < 1 || spec.depths.empty()) return invalid_argument_error("recall: no trials");
  std::mt19937_64 rng(spec.seed);
  RecallResult result;
  int64_t hits_all = 0;
  const int32_t lists = spec.trials * static_cast<int32_t>(spec.depths.size());
  int32_t lists_done = 0;
  for (const int32_t depth : spec.depths) {
    int64_t hits = 0, total = 0;
    for (int32_t t = 0; t < spec.trials; ++t) {
      std::vector<size_t> order(spec.words.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int32_t> list;
      for (int32_t w = 0; w < spec.list_words; ++w)
        list.insert(list.end(), spec.words[order[w]].begin(), spec.words[order[w]].end());
      const int64_t needle = static_cast<int64_t>(spec.intro.size() + list.size() + spec.terminator.size());
      const int64_t tail = depth - static_cast<int64_t>(spec.intro.size());  // filler after the list
      const int64_t head = spec.context_tokens - needle - depth;              // filler before it
      if (tail < 0 || head < 0)
        return invalid_argument_error("recall: depth {} leaves no room for a list of {} tokens in {} tokens", depth,
                                      needle, spec.context_tokens);
      const size_t start = std::uniform_int_distribution<size_t>(
          0, spec.filler.size() - static_cast<size_t>(head + tail))(rng);
      std::vector<int32_t> prompt(spec.filler.begin() + static_cast<int64_t>(start),
                                  spec.filler.begin() + static_cast<int64_t>(start) + head);
      prompt.insert(prompt.end(), spec.intro.begin(), spec.intro.end());
      prompt.insert(prompt.end(), list.begin(), list.end());
      prompt.insert(prompt.end(), spec.terminator.begin(), spec.terminator.end());
      const auto tail_begin = spec.filler.begin() + static_cast<int64_t>(start) + head;
      prompt.insert(prompt.end(), tail_begin, tail_begin + tail);
      prompt.insert(prompt.end(), spec.intro.begin(), spec.intro.end());
      PAGODA_ASSIGN_OR_RETURN(GreedyOutput out,
                              runner.greedy(prompt, static_cast<int32_t>(list.size()), std::span<const int32_t>{}));
      for (size_t i = 0; i < list.size(); ++i) hits += i < out.tokens.size() && out.tokens[i] == list[i] ? 1 : 0;
      total += static_cast<int64_t>(list.size());
      result.prefill_seconds += out.prefill_seconds;
      result.decode_seconds += out.decode_seconds;
      result.decoded_tokens += std::max<int64_t>(0, static_cast<int64_t>(out.tokens.size()) - 1);
      if (progress) progress(++lists_done, lists);
    }
    result.accuracy_by_depth.push_back(total > 0 ? static_cast<double>(hits) / static_cast<double>(total) : 0.0);
    hits_all += hits;
    result.list_tokens += total;
  }
  result.token_accuracy =
      result.list_tokens > 0 ? static_cast<double>(hits_all) / static_cast<double>(result.list_tokens) : 0.0;
  return result;
}

}  // namespace pagoda::eval
