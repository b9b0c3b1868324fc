// `pagoda eval`: the quality harness every KV-compression feature is judged by.
//
//   pagoda eval perplexity --model DIR --text-file F [--kv-dtype auto|f32|bf16|fp8|int8|int4]
//                          [--kv-cache-dtype-k X] [--kv-cache-dtype-v X]
//                          [--block-size N] [--window N] [--prefill-chunk N] [--max-tokens N] [--json]
//   pagoda eval agreement  --model DIR --text-file F --kv-dtype X[,Y,K/V...] [--block-size N]
//                          [--baseline-kv-dtype auto] [--baseline-block-size N] ... [--json]
//
// --kv-cache-dtype is an alias of --kv-dtype; --kv-cache-dtype-k / -v set K and V apart (e.g. K
// int8, V int4). agreement takes a comma-separated list of variants, each a dtype or a "K/V" pair
// like int8/int4; the baseline is scored once for all of them, and with --json each variant's
// result is one line (the last line is the last variant).
//
// Both tokenize the file without special tokens, cut the ids into windows of --window tokens
// (default: the model's max_position_embeddings) and run each window from an empty cache through
// the engine and the paged KV path on --device cpu or cuda (eval/paged_runner.h), exactly the protocol tools/train/train.py used for the
// transformers figures. Progress goes to stderr; with --json the last stdout line is one JSON
// object ({"perplexity": ..., "tokens": ...} for perplexity).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/kv_compression_flags.h"
#include "pagoda/cli/runner_flags.h"
#include "pagoda/backend/registry.h"
#include "pagoda/eval/agreement.h"
#include "pagoda/eval/paged_runner.h"
#include "pagoda/eval/perplexity.h"
#include "pagoda/eval/recall.h"
#include "pagoda/model/model_config.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::cli {
namespace {

struct EvalOptions {
  std::string model_dir;
  std::string device = "cpu";
  std::string text_file;
  std::string kv_dtype = "auto";
  std::string key_dtype;    // --kv-cache-dtype-k; empty: as --kv-dtype
  std::string value_dtype;  // --kv-cache-dtype-v
  int32_t block_size = 16;
  std::string baseline_kv_dtype = "auto";
  int32_t baseline_block_size = 16;
  int32_t window = 0;  // 0: max_position_embeddings
  int32_t prefill_chunk = 256;
  int32_t tensor_parallel_size = 1;  // --tensor-parallel-size: every runner of the run
  std::string quantization;  // --quantization: the (variant) runner's weights; the agree baseline stays as loaded
  int64_t max_tokens = 0;  // 0: the whole file
  std::string kv_offload_memory = "0";  // the host KV tier (runner_flags.h)
  std::string preemption_mode;
  bool json = false;
  bool quiet = false;
  KvCompressionFlags kv_compression;  // the (variant) runner's token eviction
  int32_t kv_cross_layer_share = 1;   // the (variant) runner's --kv-cross-layer-share
  // eval recall's sweep.
  std::string policies = "none,streaming,h2o,snapkv,pyramidkv,entropy";
  std::string budgets = "128,256";
  int32_t context_tokens = 0;     // 0: fit the model's context (recall_context_tokens)
  std::string depths = "auto";    // auto: recall_depths, the back half of the context
  int32_t trials = 2;
  int32_t list_words = 8;
  int64_t agreement_tokens = 0;  // 0: no perplexity / agreement in the sweep
  uint64_t seed = 1;
};

using Clock = std::chrono::steady_clock;

// "auto" -> nullopt (the model's own KV dtype); otherwise a KV dtype name.
std::optional<DType> parse_kv_dtype(const std::string& name, const char* flag) {
  if (name == "auto") return std::nullopt;
  auto dtype = dtype_from_name(name);
  if (!dtype)
    fail(fmt::format("{} '{}' is not a KV dtype (auto, f32, bf16, f16, fp8, int8, int4)", flag,
                     name));
  return dtype;
}

std::string kv_dtype_label(const std::optional<DType>& dtype) {
  return dtype ? std::string(dtype_name(*dtype)) : "auto";
}

// The K and V dtypes of one runner (nullopt: the model's own, f32 on the CPU).
struct KvDtypes {
  std::optional<DType> key;
  std::optional<DType> value;

  std::string label() const {
    const std::string k = kv_dtype_label(key), v = kv_dtype_label(value);
    return k == v ? k : k + "/" + v;
  }
};

// --kv-dtype X with the optional per-K / per-V overrides.
KvDtypes resolve_kv_dtypes(const std::string& both, const std::string& key, const std::string& value) {
  KvDtypes d;
  d.key = d.value = parse_kv_dtype(both, "--kv-dtype");
  if (!key.empty()) d.key = parse_kv_dtype(key, "--kv-cache-dtype-k");
  if (!value.empty()) d.value = parse_kv_dtype(value, "--kv-cache-dtype-v");
  return d;
}

// One entry of agreement's variant list: "int8" or "int8/int4" (K/V).
KvDtypes parse_variant(const std::string& spec) {
  const size_t slash = spec.find('/');
  if (slash == std::string::npos) return resolve_kv_dtypes(spec, "", "");
  return resolve_kv_dtypes("auto", spec.substr(0, slash), spec.substr(slash + 1));
}

struct LoadedInputs {
  std::vector<int32_t> tokens;
  int32_t window = 0;
};

LoadedInputs load_inputs(const EvalOptions& opt) {
  LoadedInputs in;
  auto config = load_model_config(opt.model_dir);
  if (!config.ok()) fail(fmt::format("loading model '{}': {}", opt.model_dir, config.status().to_string()));

  auto tok = tokenizer::Tokenizer::load(opt.model_dir);
  if (!tok.ok()) fail(fmt::format("loading tokenizer of '{}': {}", opt.model_dir, tok.status().to_string()));

  std::ifstream file(opt.text_file, std::ios::binary);
  if (!file) fail(fmt::format("cannot open --text-file '{}'", opt.text_file));
  std::stringstream buffer;
  buffer << file.rdbuf();
  const std::string text = buffer.str();
  if (text.empty()) fail(fmt::format("--text-file '{}' is empty", opt.text_file));

  in.tokens = (*tok)->encode(text, /*add_special_tokens=*/false);
  if (opt.max_tokens > 0 && static_cast<int64_t>(in.tokens.size()) > opt.max_tokens)
    in.tokens.resize(static_cast<size_t>(opt.max_tokens));
  if (in.tokens.size() < 2)
    fail(fmt::format("--text-file '{}' has {} token(s); at least 2 are needed", opt.text_file,
                     in.tokens.size()));

  const int32_t context = config->max_position_embeddings;
  in.window = opt.window > 0 ? opt.window : context;
  if (in.window < 2)
    fail(fmt::format("the model's max_position_embeddings is {}; pass --window N (>= 2)", context));
  if (context > 0 && in.window > context)
    fail(fmt::format("--window {} exceeds the model's max_position_embeddings {}", in.window, context));
  return in;
}

backend::Device parse_device(const std::string& name) {
  if (name == "cpu") return backend::Device::kCpu;
  if (name == "cuda") return backend::Device::kCuda;
  fail(fmt::format("--device {}: expected cpu or cuda", name));
}

// One runner over the model on opt.device with the given KV settings (its own
// weights and a KV pool sized to one window), driven through the engine.
std::unique_ptr<eval::PagedRunner> make_runner(const EvalOptions& opt, int32_t window, int32_t block_size,
                                               const KvDtypes& kv_dtypes, bool quantize = true,
                                               const runtime::KvCompressionConfig& compression = {}) {
  backend::RunnerSpec spec;
  spec.device = parse_device(opt.device);
  if (quantize) {
    auto quantization = parse_weight_quantization(opt.quantization, spec.device);
    if (!quantization.ok()) fail(quantization.status().to_string());
    spec.weight_quantization = *quantization;
    spec.kv_cross_layer_share = opt.kv_cross_layer_share;  // the variant's; an agreement baseline shares nothing
  }
  if (auto tp = check_tensor_parallel_size(opt.tensor_parallel_size); !tp.ok()) fail(tp.to_string());
  spec.tensor_parallel_size = opt.tensor_parallel_size;
  spec.model_dir = opt.model_dir;
  spec.config_path = (std::filesystem::path(opt.model_dir) / "config.json").string();
  const DType device_default = spec.device == backend::Device::kCuda ? DType::kBF16 : DType::kF32;
  spec.key_dtype = kv_dtypes.key.value_or(device_default);
  spec.value_dtype = kv_dtypes.value.value_or(device_default);
  spec.block_size = block_size;
  spec.max_num_seqs = 1;
  spec.max_tokens_per_step = opt.prefill_chunk;
  auto offload = parse_kv_offload_memory(opt.kv_offload_memory);
  if (!offload.ok()) fail(offload.status().to_string());
  spec.kv_offload_memory = *offload;
  auto preemption = parse_preemption_mode(opt.preemption_mode, spec.kv_offload_memory > 0);
  if (!preemption.ok()) fail(preemption.status().to_string());
  eval::PagedRunnerOptions options;
  options.preemption_mode = *preemption;
  options.block_size = block_size;
  options.key_dtype = kv_dtypes.key;
  options.value_dtype = kv_dtypes.value;
  options.prefill_chunk = opt.prefill_chunk;
  options.max_sequence_tokens = window;
  options.kv_compression = compression;
  backend::RunnerRequirements needs;
  needs.min_kv_tokens = static_cast<int64_t>(options.num_kv_blocks()) * block_size;
  needs.sequence_tokens = window;
  needs.size_pool_to_request = true;
  needs.show_progress = false;
  auto setup = backend::create_model_runner(spec, needs);
  if (!setup.ok()) fail(setup.status().to_string());
  auto runner = eval::PagedRunner::create(std::move(setup->runner), options);
  if (!runner.ok()) fail(runner.status().to_string());
  return std::move(*runner);
}

// A progress line on stderr, redrawn in place: "<what> done/total  seconds".
eval::ProgressCallback progress_printer(bool quiet, Clock::time_point start, std::string what = "window") {
  if (quiet) return nullptr;
  return [start, what = std::move(what)](int32_t done, int32_t total) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::fprintf(stderr, "\r%s %d/%d  %.1fs", what.c_str(), done, total, seconds);
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

void run_perplexity(const EvalOptions& opt) {
  const KvDtypes kv_dtype = resolve_kv_dtypes(opt.kv_dtype, opt.key_dtype, opt.value_dtype);
  LoadedInputs in = load_inputs(opt);
  auto compression = resolve_kv_compression_flags(opt.kv_compression, parse_device(opt.device),
                                                  opt.kv_cross_layer_share);
  if (!compression.ok()) fail(compression.status().to_string());
  auto runner = make_runner(opt, in.window, opt.block_size, kv_dtype, true, *compression);
  const auto start = Clock::now();
  auto result = eval::compute_perplexity(*runner, in.tokens, in.window,
                                         progress_printer(opt.quiet || opt.json, start));
  if (!result.ok()) fail(result.status().to_string());
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  nlohmann::json out = {
      {"perplexity", result->perplexity},
      {"tokens", result->tokens},
      {"mean_nll", result->mean_nll},
      {"windows", result->windows},
      {"window", in.window},
      {"device", opt.device},
      {"kv_dtype", kv_dtype.label()},
      {"key_dtype", kv_dtype_label(kv_dtype.key)},
      {"value_dtype", kv_dtype_label(kv_dtype.value)},
      {"block_size", opt.block_size},
      {"kv_compression", opt.kv_compression.policy},
      {"kv_cross_layer_share", opt.kv_cross_layer_share},
      {"kv_budget", opt.kv_compression.budget},
      {"seconds", seconds},
      {"text_file", opt.text_file},
  };
  if (opt.json) {
    std::cout << out.dump() << std::endl;
    return;
  }
  std::cout << fmt::format(
      "perplexity {:.4f} over {} predicted tokens ({} windows of up to {} tokens)\n"
      "mean NLL {:.6f} nats/token; KV {} with blocks of {}; {:.1f} s ({:.0f} tokens/s)\n",
      result->perplexity, result->tokens, result->windows, in.window, result->mean_nll,
      kv_dtype.label(), opt.block_size, seconds, result->tokens / std::max(seconds, 1e-9));
}

void run_agreement(const EvalOptions& opt) {
  std::vector<KvDtypes> variants;
  if (!opt.key_dtype.empty() || !opt.value_dtype.empty()) {
    if (opt.kv_dtype.find(',') != std::string::npos)
      fail("--kv-cache-dtype-k / -v take one variant; give a list as --kv-dtype int8,int4,int8/int4");
    variants.push_back(resolve_kv_dtypes(opt.kv_dtype.empty() ? "auto" : opt.kv_dtype, opt.key_dtype,
                                         opt.value_dtype));
  } else {
    std::stringstream list(opt.kv_dtype);
    std::string spec;
    while (std::getline(list, spec, ','))
      if (!spec.empty()) variants.push_back(parse_variant(spec));
  }
  if (variants.empty()) fail("give the variant's KV dtype: --kv-dtype X (or --kv-cache-dtype-k / -v)");
  const KvDtypes baseline_dtype = resolve_kv_dtypes(opt.baseline_kv_dtype, "", "");
  LoadedInputs in = load_inputs(opt);
  auto baseline = make_runner(opt, in.window, opt.baseline_block_size, baseline_dtype, /*quantize=*/false);
  std::vector<std::unique_ptr<eval::PagedRunner>> runners;
  std::vector<eval::PagedRunner*> pointers;
  auto compression = resolve_kv_compression_flags(opt.kv_compression, parse_device(opt.device),
                                                  opt.kv_cross_layer_share);
  if (!compression.ok()) fail(compression.status().to_string());
  for (const KvDtypes& v : variants) {
    runners.push_back(make_runner(opt, in.window, opt.block_size, v, true, *compression));
    pointers.push_back(runners.back().get());
  }
  const auto start = Clock::now();
  auto results = eval::compute_agreement(*baseline, pointers, in.tokens, in.window,
                                         progress_printer(opt.quiet || opt.json, start));
  if (!results.ok()) fail(results.status().to_string());
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  for (size_t i = 0; i < variants.size(); ++i) {
    const eval::AgreementResult& result = (*results)[i];
    nlohmann::json out = {
        {"top1_agreement", result.top1_agreement},
        {"mean_kl", result.mean_kl},
        {"max_kl", result.max_kl},
        {"baseline_perplexity", result.baseline_perplexity},
        {"variant_perplexity", result.variant_perplexity},
        {"perplexity_change_percent", result.perplexity_change_percent},
        {"tokens", result.tokens},
        {"windows", result.windows},
        {"window", in.window},
        {"device", opt.device},
        {"kv_dtype", variants[i].label()},
        {"key_dtype", kv_dtype_label(variants[i].key)},
        {"value_dtype", kv_dtype_label(variants[i].value)},
        {"block_size", opt.block_size},
        {"baseline_kv_dtype", baseline_dtype.label()},
        {"baseline_block_size", opt.baseline_block_size},
        {"kv_compression", opt.kv_compression.policy},
        {"kv_cross_layer_share", opt.kv_cross_layer_share},
        {"kv_budget", opt.kv_compression.budget},
        {"seconds", seconds},
        {"text_file", opt.text_file},
    };
    if (opt.json) {
      std::cout << out.dump() << std::endl;
      continue;
    }
    std::cout << fmt::format(
        "variant KV {} (blocks of {}) vs baseline KV {} (blocks of {}) over {} predicted tokens\n"
        "top-1 agreement {:.4f}%  mean KL {:.3e} nats  max KL {:.3e}\n"
        "perplexity {:.4f} -> {:.4f} ({:+.3f}%)\n",
        variants[i].label(), opt.block_size, baseline_dtype.label(), opt.baseline_block_size,
        result.tokens, result.top1_agreement * 100.0, result.mean_kl, result.max_kl,
        result.baseline_perplexity, result.variant_perplexity, result.perplexity_change_percent);
  }
  if (!opt.json) std::cout << fmt::format("{:.1f} s\n", seconds);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int32_t parse_count(const std::string& text, const char* flag) {
  try {
    size_t used = 0;
    const long v = std::stol(text, &used);
    if (used == text.size() && v > 0 && v < (1L << 24)) return static_cast<int32_t>(v);
  } catch (...) {
  }
  fail(fmt::format("{} '{}': expected a positive integer", flag, text));
}

// Words the recall lists are drawn from: common, mostly one token each.
constexpr const char* kRecallWords[] = {
    "apple",  "river",  "stone",  "candle", "garden", "silver", "window", "horse",  "bread",  "winter",
    "mirror", "forest", "letter", "castle", "button", "ribbon", "violet", "anchor", "copper", "meadow",
    "pencil", "barrel", "saddle", "orange", "tiger",  "velvet", "harbor", "ladder", "marble", "feather",
    "kettle", "pepper", "rabbit", "shadow", "thunder", "valley", "wagon",  "cherry", "dragon", "lantern"};

// The recall prompt's length when --context is left out: the model's whole
// context less the list's 64 tokens and a few spare (1,980 for a 2,048
// context, the figure docs/MODEL.md measures), or 900 for a model that names
// no context.
int32_t recall_context_tokens(int32_t max_position_embeddings) {
  constexpr int32_t kListAndSpare = 68;
  if (max_position_embeddings <= kListAndSpare + 16) return 900;
  return max_position_embeddings - kListAndSpare;
}

// --depths auto: four depths over the back half of the prompt, at 1/2, 5/8,
// 3/4 and 7/8 of it, rounded to multiples of 50 once the prompt is long enough
// for round figures (1,000 / 1,250 / 1,500 / 1,750 at a context of 1,980).
std::vector<int32_t> recall_depths(int32_t context_tokens) {
  const int32_t unit = context_tokens >= 400 ? 50 : 1;
  std::vector<int32_t> depths;
  for (int32_t eighths : {4, 5, 6, 7}) {
    const int32_t exact = context_tokens * eighths / 8;
    depths.push_back(std::max<int32_t>(1, (exact + unit / 2) / unit * unit));
  }
  return depths;
}

// `pagoda eval recall`: per policy and budget, recall token accuracy of word
// lists at depths, decode speed, the KV a sequence holds, and (with
// --agreement-tokens) perplexity and agreement against no eviction.
void run_recall(const EvalOptions& opt) {
  const backend::Device device = parse_device(opt.device);
  auto config = load_model_config(opt.model_dir);
  if (!config.ok()) fail(fmt::format("loading model '{}': {}", opt.model_dir, config.status().to_string()));
  auto tok = tokenizer::Tokenizer::load(opt.model_dir);
  if (!tok.ok()) fail(fmt::format("loading tokenizer of '{}': {}", opt.model_dir, tok.status().to_string()));
  LoadedInputs in = load_inputs(opt);

  eval::RecallSpec spec;
  spec.filler = in.tokens;
  for (const char* w : kRecallWords) spec.words.push_back((*tok)->encode(std::string(" ") + w, false));
  spec.intro = (*tok)->encode("\nThe words to remember are:", false);
  spec.terminator = (*tok)->encode(".\n", false);
  spec.list_words = opt.list_words;
  spec.context_tokens =
      opt.context_tokens > 0 ? opt.context_tokens : recall_context_tokens(config->max_position_embeddings);
  spec.depths.clear();
  if (opt.depths == "auto")
    spec.depths = recall_depths(spec.context_tokens);
  else
    for (const std::string& d : split_list(opt.depths)) spec.depths.push_back(parse_count(d, "--depths"));
  spec.trials = opt.trials;
  spec.seed = opt.seed;
  const int32_t sequence_tokens = spec.context_tokens + 64;
  if (config->max_position_embeddings > 0 && sequence_tokens > config->max_position_embeddings)
    fail(fmt::format("--context {} (+64 for the list) exceeds the model's max_position_embeddings {}",
                     spec.context_tokens, config->max_position_embeddings));
  if (!opt.quiet && !opt.json)
    std::cerr << fmt::format("recall prompts of {} tokens, lists at depths {}, {} trials each\n",
                             spec.context_tokens, fmt::join(spec.depths, ","), spec.trials);

  std::vector<int32_t> agreement_text;
  if (opt.agreement_tokens > 0)
    agreement_text.assign(in.tokens.begin(),
                          in.tokens.begin() + std::min<int64_t>(opt.agreement_tokens, in.tokens.size()));
  const KvDtypes dtypes = resolve_kv_dtypes(opt.kv_dtype, opt.key_dtype, opt.value_dtype);
  std::unique_ptr<eval::PagedRunner> baseline;
  if (!agreement_text.empty()) baseline = make_runner(opt, in.window, opt.block_size, dtypes, false);

  // The table's header goes out with its first row, so an input error (a depth
  // that leaves no room for the list) ends the run without a dangling header.
  bool header_written = false;
  for (const std::string& policy : split_list(opt.policies)) {
    std::vector<std::string> budgets = policy == "none" ? std::vector<std::string>{"0"} : split_list(opt.budgets);
    for (const std::string& budget_text : budgets) {
      KvCompressionFlags flags = opt.kv_compression;
      flags.policy = policy;
      flags.budget = policy == "none" ? 0 : parse_count(budget_text, "--budgets");
      auto compression = resolve_kv_compression_flags(flags, device, opt.kv_cross_layer_share);
      if (!compression.ok()) fail(compression.status().to_string());
      auto runner = make_runner(opt, std::max(in.window, sequence_tokens), opt.block_size, dtypes, true,
                                *compression);
      const std::string row_name = policy == "none" ? std::string("none") : policy + " " + budget_text;
      auto recall = eval::evaluate_recall(*runner, spec,
                                          progress_printer(opt.quiet || opt.json, Clock::now(), row_name + ": list"));
      if (!recall.ok()) fail(recall.status().to_string());
      std::optional<eval::AgreementResult> agreement;
      if (baseline) {
        auto a = eval::compute_agreement(*baseline, *runner, agreement_text, in.window);
        if (!a.ok()) fail(a.status().to_string());
        agreement = *a;
      }
      const KvPoolShape& shape = runner->kv_geometry();
      // The slots a sequence holds at most: its whole length without eviction,
      // else the largest head budget plus the block it grows before the next compaction.
      int64_t held = sequence_tokens;
      if (compression->enabled())
        held = std::min<int64_t>(held, runtime::kv_compaction_trigger(*compression, shape.num_layers, shape.block_size));
      const int64_t held_bytes = held * static_cast<int64_t>(shape.bytes_per_token());
      const double tok_s = recall->decode_seconds > 0 ? recall->decoded_tokens / recall->decode_seconds : 0.0;
      nlohmann::json depth_acc = nlohmann::json::array();
      for (double a : recall->accuracy_by_depth) depth_acc.push_back(a);
      nlohmann::json out = {{"policy", policy},
                            {"budget", flags.budget},
                            {"recall", recall->token_accuracy},
                            {"recall_by_depth", depth_acc},
                            {"depths", spec.depths},
                            {"list_tokens", recall->list_tokens},
                            {"kv_tokens_held", held},
                            {"kv_bytes_held", held_bytes},
                            {"decode_tokens_per_second", tok_s},
                            {"context", spec.context_tokens}};
      if (agreement) {
        out["perplexity"] = agreement->variant_perplexity;
        out["baseline_perplexity"] = agreement->baseline_perplexity;
        out["perplexity_change_percent"] = agreement->perplexity_change_percent;
        out["top1_agreement"] = agreement->top1_agreement;
        out["agreement_tokens"] = agreement->tokens;
      }
      if (opt.json) {
        std::cout << out.dump() << std::endl;
        continue;
      }
      if (!header_written)
        std::cout << "| policy | budget | recall | ppl | ppl change | top-1 agreement | KV held / seq | decode tok/s |\n"
                     "|---|---|---|---|---|---|---|---|\n";
      header_written = true;
      std::cout << fmt::format("| {} | {} | {:.3f} | {} | {} | {} | {} tokens, {:.2f} MiB | {:.1f} |\n", policy,
                               policy == "none" ? std::string("full") : budget_text, recall->token_accuracy,
                               agreement ? fmt::format("{:.3f}", agreement->variant_perplexity) : "-",
                               agreement ? fmt::format("{:+.2f}%", agreement->perplexity_change_percent) : "-",
                               agreement ? fmt::format("{:.4f}", agreement->top1_agreement) : "-", held,
                               held_bytes / 1048576.0, tok_s);
      std::cout.flush();
    }
  }
}

void add_common_options(CLI::App* cmd, EvalOptions& opt) {
  cmd->add_option("--model", opt.model_dir, "Hugging Face model directory (config.json, safetensors, tokenizer.json)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--device", opt.device,
                  "cpu (the reference backend) or cuda (NVIDIA Hopper GPU, when compiled in): where the model and "
                  "its KV cache run, so a device's own KV quantization is what gets measured")
      ->capture_default_str();
  cmd->add_option("--text-file", opt.text_file, "UTF-8 text to score, e.g. models/pagoda-tiny/heldout.txt")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--block-size", opt.block_size, "KV cache block size in tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--window", opt.window, "tokens per window (default: max_position_embeddings)")
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--prefill-chunk", opt.prefill_chunk, "tokens per forward while prefilling a window (1 = decode path)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  add_host_tier_flags(*cmd, opt.kv_offload_memory, opt.preemption_mode);
  cmd->add_option("--max-tokens", opt.max_tokens, "score only the first N tokens of the file (0 = all)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cli::add_quantization_flag(*cmd, opt.quantization);
  cli::add_tensor_parallel_flag(*cmd, opt.tensor_parallel_size);
  cmd->add_flag("--json", opt.json, "print the result as one JSON line (last on stdout), no progress");
  cmd->add_flag("--quiet", opt.quiet, "no progress on stderr");
  add_kv_compression_flags(*cmd, opt.kv_compression);
  add_cross_layer_share_flag(*cmd, opt.kv_cross_layer_share);
}

}  // namespace

void add_eval_command(CLI::App& app) {
  CLI::App* eval = app.add_subcommand(
      "eval", "Quality harness: perplexity and KV-variant agreement through the paged KV path.");
  eval->require_subcommand(1);

  auto ppl = std::make_shared<EvalOptions>();
  CLI::App* ppl_cmd = eval->add_subcommand(
      "perplexity", "Perplexity of a text file (windows of --window tokens, each from an empty cache).");
  add_common_options(ppl_cmd, *ppl);
  ppl_cmd->add_option("--kv-dtype,--kv-cache-dtype", ppl->kv_dtype, "KV cache dtype: auto, f32, bf16, f16, fp8, int8, int4")
      ->capture_default_str();
  ppl_cmd->add_option("--kv-cache-dtype-k,--kv-dtype-k", ppl->key_dtype, "K cache dtype (overrides --kv-dtype for K)");
  ppl_cmd->add_option("--kv-cache-dtype-v,--kv-dtype-v", ppl->value_dtype, "V cache dtype (overrides --kv-dtype for V)");
  ppl_cmd->callback([ppl] { run_perplexity(*ppl); });

  auto agree = std::make_shared<EvalOptions>();
  CLI::App* agree_cmd = eval->add_subcommand(
      "agreement",
      "Top-1 agreement and KL divergence of next-token distributions: a KV variant vs the baseline.");
  add_common_options(agree_cmd, *agree);
  agree->kv_dtype.clear();
  agree_cmd->add_option("--kv-dtype,--kv-cache-dtype", agree->kv_dtype,
                        "the variants' KV dtypes, comma-separated: bf16, fp8, int8, int4, or K/V pairs like int8/int4");
  agree_cmd->add_option("--kv-cache-dtype-k,--kv-dtype-k", agree->key_dtype, "the variant's K dtype (one variant)");
  agree_cmd->add_option("--kv-cache-dtype-v,--kv-dtype-v", agree->value_dtype, "the variant's V dtype (one variant)");
  agree_cmd->add_option("--baseline-kv-dtype", agree->baseline_kv_dtype, "the baseline's KV dtype")->capture_default_str();
  agree_cmd->add_option("--baseline-block-size", agree->baseline_block_size, "the baseline's KV block size")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  agree_cmd->callback([agree] { run_agreement(*agree); });

  auto recall = std::make_shared<EvalOptions>();
  CLI::App* recall_cmd = eval->add_subcommand(
      "recall",
      "Token eviction sweep: word-list recall at depths, decode speed, KV held and (with --agreement-tokens) "
      "perplexity / agreement, per --kv-compression policy and budget.\n"
      "  pagoda eval recall --model models/pagoda-tiny --text-file models/pagoda-tiny/heldout.txt "
      "--policies none,streaming,snapkv --budgets 128,256 --agreement-tokens 4096 --window 512");
  add_common_options(recall_cmd, *recall);
  recall_cmd->add_option("--kv-dtype,--kv-cache-dtype", recall->kv_dtype, "KV cache dtype")->capture_default_str();
  recall_cmd->add_option("--policies", recall->policies, "token eviction policies to compare, comma-separated")
      ->capture_default_str();
  recall_cmd->add_option("--budgets", recall->budgets, "--kv-budget values to compare, comma-separated")
      ->capture_default_str();
  recall_cmd->add_option("--context", recall->context_tokens,
                         "prompt tokens of each recall trial (default: the model's context less 68)")
      ->check(CLI::Range(16, 1 << 20));
  recall_cmd->add_option("--depths", recall->depths,
                         "tokens from the list's end to the prompt's end, comma-separated; auto: 1/2, 5/8, 3/4 "
                         "and 7/8 of --context")
      ->capture_default_str();
  recall_cmd->add_option("--trials", recall->trials, "trials per depth")->capture_default_str()->check(CLI::Range(1, 1000));
  recall_cmd->add_option("--list-words", recall->list_words, "words per list")
      ->capture_default_str()
      ->check(CLI::Range(1, 40));
  recall_cmd->add_option("--agreement-tokens", recall->agreement_tokens,
                         "also score the first N tokens of --text-file in --window windows against no eviction "
                         "(0: skip)")
      ->capture_default_str();
  recall_cmd->add_option("--seed", recall->seed, "word and filler choice")->capture_default_str();
  recall_cmd->callback([recall] { run_recall(*recall); });
}

}  // namespace pagoda::cli
