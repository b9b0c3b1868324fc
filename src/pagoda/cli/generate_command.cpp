// `pagoda generate`: one prompt, one sequence, through the CPU reference model
// and a small local paged KV pool (blocks 0..n-1). Deliberately thin: the real
// scheduler and sampler live in engine/; this command is the shortest path
// from a checkpoint to tokens, and what the reference tests' numbers can be
// reproduced with by hand.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/backend/cpu_kv_pool.h"
#include "pagoda/cli/commands.h"
#include "pagoda/kernels/cpu/logprobs.h"
#include "pagoda/model/cpu_model.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::cli {

namespace {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  std::string prompt_ids;
  int32_t max_tokens = 32;
  double temperature = 0.0;
  int32_t top_k = 0;
  uint64_t seed = 0;
  int32_t logprobs = 0;
  int32_t block_size = 16;
  bool json = false;
  bool ignore_eos = false;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<int32_t> parse_prompt_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 0 || value > INT32_MAX)
      fail("--prompt-ids: '" + item + "' is not a token id (expected e.g. 1,2,3)");
    ids.push_back(static_cast<int32_t>(value));
    pos = comma + 1;
  }
  return ids;
}

// Greedy at temperature 0; otherwise samples softmax(logits / T) restricted to
// the top_k most likely ids (all when top_k is 0).
int32_t pick_token(const std::vector<float>& logits, double temperature, int32_t top_k, std::mt19937_64& rng) {
  if (temperature <= 0.0) return kernels::argmax(logits.data(), logits.size());
  const size_t k = top_k > 0 ? static_cast<size_t>(top_k) : logits.size();
  const auto candidates = kernels::top_k(logits.data(), logits.size(), k);
  std::vector<double> weights;
  weights.reserve(candidates.size());
  const double max_logit = candidates.front().second;
  for (const auto& [id, logit] : candidates) weights.push_back(std::exp((logit - max_logit) / temperature));
  std::discrete_distribution<size_t> dist(weights.begin(), weights.end());
  return candidates[dist(rng)].first;
}

void run_generate(const GenerateOptions& opt) {
  const std::filesystem::path dir(opt.model_dir);
  auto progress = [](const std::string& line) { std::fprintf(stderr, "[generate] %s\n", line.c_str()); };

  // Cheap checks first, before a possibly long model load.
  std::vector<int32_t> prompt;
  if (!opt.prompt_ids.empty()) prompt = parse_prompt_ids(opt.prompt_ids);
  std::error_code ec;
  const bool has_tokenizer = std::filesystem::exists(dir / "tokenizer.json", ec);
  if (!opt.prompt.empty() && !has_tokenizer)
    fail("--prompt needs " + (dir / "tokenizer.json").string() + "; pass token ids with --prompt-ids instead");

  const auto load_start = Clock::now();
  progress("loading " + dir.string());
  WeightLoadOptions load_options;
  load_options.progress = progress;
  auto loaded = CpuModel::load(dir, load_options);
  if (!loaded.ok()) fail(loaded.status().to_string());
  std::unique_ptr<CpuModel> model = std::move(*loaded);
  const ModelConfig& config = model->config();
  progress(fmt::format("{} loaded in {:.2f} s: {} layers, hidden {}, heads {}/{} (head_dim {}), vocab {}, weights {}{}",
                       config.architecture_name, seconds_since(load_start), config.num_layers, config.hidden_size,
                       config.num_q_heads, config.num_kv_heads, config.head_dim, config.vocab_size,
                       dtype_name(model->weights().file_dtype),
                       model->weights().upcast_to_f32 ? " (upcast to f32)" : " (mmapped)"));

  // The tokenizer is optional with --prompt-ids (then "text" is left out).
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  if (has_tokenizer) {
    auto t = tokenizer::Tokenizer::load(dir);
    if (!t.ok()) {
      if (!opt.prompt.empty()) fail(t.status().to_string());
      progress("tokenizer not usable, output stays ids only: " + t.status().to_string());
    } else {
      tok = *t;
    }
  }

  if (opt.prompt_ids.empty()) {
    prompt = tok->encode(opt.prompt, /*add_special_tokens=*/true);
    if (prompt.empty()) fail("--prompt encodes to no tokens");
  }
  for (int32_t id : prompt)
    if (id >= config.vocab_size)
      fail(fmt::format("prompt token id {} is outside the model's vocabulary [0, {})", id, config.vocab_size));

  const int64_t total = static_cast<int64_t>(prompt.size()) + opt.max_tokens;
  if (total > config.max_position_embeddings)
    fail(fmt::format("prompt ({} tokens) + --max-tokens {} exceeds max_position_embeddings {}", prompt.size(),
                     opt.max_tokens, config.max_position_embeddings));
  const int32_t num_blocks = static_cast<int32_t>((total + opt.block_size - 1) / opt.block_size);
  auto pool = CpuKvPool::create(model->kv_pool_shape(num_blocks, opt.block_size));
  if (!pool.ok()) fail(pool.status().to_string());

  // One sequence owning blocks 0..n-1 of the local pool.
  SequenceSlice seq;
  for (int32_t b = 0; b < num_blocks; ++b) seq.block_table.push_back(b);
  ForwardBatch batch;
  batch.token_ids = prompt;
  for (size_t i = 0; i < prompt.size(); ++i) batch.positions.push_back(static_cast<int32_t>(i));
  seq.num_new_tokens = static_cast<int32_t>(prompt.size());
  batch.sequences = {seq};

  std::mt19937_64 rng(opt.seed);
  std::vector<float> logits, logprobs(static_cast<size_t>(config.vocab_size));
  std::vector<int32_t> generated;
  nlohmann::json top_logprobs = nlohmann::json::array();
  std::unique_ptr<tokenizer::IncrementalDetokenizer> stream;
  if (tok && !opt.json) stream = std::make_unique<tokenizer::IncrementalDetokenizer>(*tok);

  const auto prefill_start = Clock::now();
  double prefill_seconds = 0;
  Clock::time_point decode_start;
  int32_t context = 0;
  while (static_cast<int32_t>(generated.size()) < opt.max_tokens) {
    const Status status = model->forward(batch, *pool, logits);
    if (!status.ok()) fail(status.to_string());
    if (generated.empty()) {
      prefill_seconds = seconds_since(prefill_start);
      decode_start = Clock::now();
    }
    context += batch.num_tokens();

    if (opt.logprobs > 0) {
      kernels::log_softmax(logits.data(), logprobs.data(), logprobs.size());
      nlohmann::json step = nlohmann::json::array();
      for (const auto& [id, lp] : kernels::top_k(logprobs.data(), logprobs.size(), static_cast<size_t>(opt.logprobs)))
        step.push_back({id, lp});
      top_logprobs.push_back(step);
    }
    const int32_t next = pick_token(logits, opt.temperature, opt.top_k, rng);
    generated.push_back(next);
    if (stream) {
      std::cout << stream->feed(next) << std::flush;
    }
    if (!opt.ignore_eos && config.is_eos(next)) break;

    batch.token_ids = {next};
    batch.positions = {context};
    batch.sequences[0].num_cached_tokens = context;
    batch.sequences[0].num_new_tokens = 1;
  }
  const double decode_seconds = seconds_since(decode_start);
  if (stream) std::cout << stream->flush() << std::endl;

  const size_t decode_steps = generated.size() > 0 ? generated.size() - 1 : 0;
  progress(fmt::format("prefill {} tokens in {:.3f} s ({:.1f} tok/s); decode {} tokens in {:.3f} s ({:.1f} tok/s)",
                       prompt.size(), prefill_seconds, prompt.size() / std::max(prefill_seconds, 1e-9),
                       decode_steps, decode_seconds, decode_steps / std::max(decode_seconds, 1e-9)));

  if (opt.json) {
    nlohmann::json out = {{"tokens", generated}};
    if (opt.logprobs > 0) out["logprobs"] = top_logprobs;
    if (tok) out["text"] = tok->decode(generated, /*skip_special_tokens=*/true);
    std::cout << out.dump() << std::endl;
  } else if (!stream) {
    for (size_t i = 0; i < generated.size(); ++i) std::cout << (i ? "," : "") << generated[i];
    std::cout << std::endl;
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto opt = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate text from one prompt with the CPU reference model (greedy or sampled).");
  cmd->add_option("--model", opt->model_dir, "Hugging Face model directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  auto* prompt = cmd->add_option("--prompt", opt->prompt, "prompt text (needs tokenizer.json in the model directory)");
  auto* ids = cmd->add_option("--prompt-ids", opt->prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  prompt->excludes(ids);
  cmd->add_option("--max-tokens", opt->max_tokens, "tokens to generate")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", opt->temperature, "0 = greedy")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", opt->top_k, "sample among the K most likely tokens (0 = all)")->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--seed", opt->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--logprobs", opt->logprobs, "report the top K log-probabilities of every step")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--block-size", opt->block_size, "KV cache block size in tokens")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_flag("--json", opt->json, "print {\"tokens\", \"logprobs\", \"text\"} as one JSON line last on stdout");
  cmd->add_flag("--ignore-eos", opt->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->callback([opt] {
    if (opt->prompt.empty() && opt->prompt_ids.empty()) fail("give a prompt: --prompt TEXT or --prompt-ids 1,2,3");
    run_generate(*opt);
  });
}

}  // namespace pagoda::cli
