// `pagoda generate`: one prompt, one sequence, on the CPU reference model or
// the GPU (--device cuda), through a model runner from runner_factory.h and a
// local paged KV pool (blocks 0..n-1 of the runner's pool). Deliberately thin:
// the real scheduler lives in engine/; this command is the shortest path from a
// checkpoint to tokens, and what the reference tests' numbers can be
// reproduced with by hand. Tokens are chosen by engine::Sampler (greedy at
// temperature 0; otherwise min-p, top-k, top-p, seeded).

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/cli/runner_factory.h"
#include "pagoda/engine/sampler.h"
#include "pagoda/kernels/cpu/logprobs.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::cli {

namespace {

struct GenerateOptions {
  RunnerFlags runner;
  std::string prompt;
  std::string prompt_ids;
  int32_t max_tokens = 32;
  double temperature = 0.0;
  int32_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
  uint64_t seed = 0;
  int32_t logprobs = 0;
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

void run_generate(const GenerateOptions& opt) {
  auto progress = [](const std::string& line) { std::fprintf(stderr, "[generate] %s\n", line.c_str()); };

  // Cheap checks first, before a possibly long model load.
  auto flags = resolve_runner_flags(opt.runner, RunnerCommand::kGenerate);
  if (!flags.ok()) fail(flags.status().to_string());
  std::vector<int32_t> prompt;
  if (!opt.prompt_ids.empty()) prompt = parse_prompt_ids(opt.prompt_ids);
  std::error_code ec;
  const std::filesystem::path dir(flags->model_dir);
  const bool has_tokenizer = !flags->model_dir.empty() && std::filesystem::exists(dir / "tokenizer.json", ec);
  if (!opt.prompt.empty() && !has_tokenizer) {
    fail(flags->model_dir.empty() ? "--prompt needs a tokenizer.json beside the model; pass token ids with --prompt-ids"
                                  : "--prompt needs " + (dir / "tokenizer.json").string() +
                                        "; pass token ids with --prompt-ids instead");
  }
  if (!(opt.top_p > 0.0 && opt.top_p <= 1.0)) fail(fmt::format("--top-p {}: must be in (0, 1]", opt.top_p));
  if (!(opt.min_p >= 0.0 && opt.min_p <= 1.0)) fail(fmt::format("--min-p {}: must be in [0, 1]", opt.min_p));
  engine::SamplingParams sampling;
  sampling.temperature = static_cast<float>(opt.temperature);
  sampling.top_k = opt.top_k;
  sampling.top_p = static_cast<float>(opt.top_p);
  sampling.min_p = static_cast<float>(opt.min_p);
  sampling.max_tokens = opt.max_tokens;

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

  const int64_t total = static_cast<int64_t>(prompt.size()) + opt.max_tokens;
  if (total > INT32_MAX) fail("prompt + --max-tokens is too long");
  RunnerRequirements needs;
  needs.min_kv_tokens = total;
  needs.sequence_tokens = static_cast<int32_t>(total);
  needs.prompt_tokens = static_cast<int32_t>(prompt.size());
  needs.progress = progress;
  const auto load_start = Clock::now();
  auto setup = create_model_runner(*flags, needs);
  if (!setup.ok()) {
    if (setup.status().code() != StatusCode::kOutOfRange) fail(setup.status().to_string());
    fail(setup.status()
             .with_context(fmt::format("prompt ({} tokens) + --max-tokens {}", prompt.size(), opt.max_tokens))
             .to_string());
  }
  engine::ModelRunner& runner = *setup->runner;
  const ModelConfig& config = setup->config;
  std::istringstream report(setup->report);
  for (std::string line; std::getline(report, line);) progress(line);
  progress(fmt::format("ready in {:.2f} s", seconds_since(load_start)));

  for (int32_t id : prompt)
    if (id >= config.vocab_size)
      fail(fmt::format("prompt token id {} is outside the model's vocabulary [0, {})", id, config.vocab_size));
  if (Status valid = engine::validate_sampling_params(sampling, config.vocab_size); !valid.ok())
    fail("sampling flags: " + valid.to_string());

  // One sequence owning blocks 0..n-1 of the runner's pool.
  const int32_t num_blocks = static_cast<int32_t>((total + setup->block_size - 1) / setup->block_size);
  SequenceSlice seq;
  for (int32_t b = 0; b < num_blocks; ++b) seq.block_table.push_back(b);
  ForwardBatch batch;
  batch.token_ids = prompt;
  for (size_t i = 0; i < prompt.size(); ++i) batch.positions.push_back(static_cast<int32_t>(i));
  seq.num_new_tokens = static_cast<int32_t>(prompt.size());
  batch.sequences = {seq};

  std::mt19937_64 rng(opt.seed);
  engine::TokenHistory history;
  history.add_prompt(prompt);
  std::vector<float> logprobs(static_cast<size_t>(config.vocab_size));
  std::vector<int32_t> generated;
  nlohmann::json top_logprobs = nlohmann::json::array();
  std::unique_ptr<tokenizer::IncrementalDetokenizer> stream;
  if (tok && !opt.json) stream = std::make_unique<tokenizer::IncrementalDetokenizer>(*tok);

  const auto prefill_start = Clock::now();
  double prefill_seconds = 0;
  Clock::time_point decode_start;
  int32_t context = 0;
  while (static_cast<int32_t>(generated.size()) < opt.max_tokens) {
    auto logits = runner.execute(batch);
    if (!logits.ok()) fail(logits.status().to_string());
    if (generated.empty()) {
      prefill_seconds = seconds_since(prefill_start);
      decode_start = Clock::now();
    }
    context += batch.num_tokens();

    if (opt.logprobs > 0) {
      kernels::log_softmax(logits->data(), logprobs.data(), logprobs.size());
      nlohmann::json step = nlohmann::json::array();
      for (const auto& [id, lp] : kernels::top_k(logprobs.data(), logprobs.size(), static_cast<size_t>(opt.logprobs)))
        step.push_back({id, lp});
      top_logprobs.push_back(step);
    }
    const int32_t next = engine::Sampler::sample(*logits, sampling, history, rng).token;
    history.add_output(next);
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
      "generate",
      "Generate text from one prompt, greedy or sampled, on the CPU or the GPU.\n"
      "  pagoda generate --model models/pagoda-tiny --prompt \"Once upon a time\" --max-tokens 50\n"
      "  pagoda generate --model DIR --device cuda --kv-cache-dtype fp8 --prompt \"Hello\"\n"
      "  pagoda generate --model tools/gpu_backend/llama3_8b_config.json --load-format random --device cuda "
      "--prompt-ids 1,2,3\n"
      "The model/device/KV report goes to stderr; the text (or token ids) to stdout.");
  add_runner_flags(*cmd, opt->runner, RunnerCommand::kGenerate);
  auto* prompt = cmd->add_option("--prompt", opt->prompt, "prompt text (needs tokenizer.json in the model directory)");
  auto* ids = cmd->add_option("--prompt-ids", opt->prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  prompt->excludes(ids);
  cmd->add_option("--max-tokens", opt->max_tokens, "tokens to generate")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", opt->temperature, "0 = greedy")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", opt->top_k, "sample among the K most likely tokens (0 = all)")->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--top-p", opt->top_p, "sample among the most likely tokens whose probabilities add up to P (1 = all)")
      ->capture_default_str();
  cmd->add_option("--min-p", opt->min_p, "drop tokens less likely than P x the most likely one (0 = off)")
      ->capture_default_str();
  cmd->add_option("--seed", opt->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--logprobs", opt->logprobs, "report the top K log-probabilities of every step")->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--json", opt->json, "print {\"tokens\", \"logprobs\", \"text\"} as one JSON line last on stdout");
  cmd->add_flag("--ignore-eos", opt->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->callback([opt] {
    if (opt->runner.model.empty() && opt->runner.config_file.empty())
      fail("--model is required: a Hugging Face model directory (or, with --load-format random, a config.json)");
    if (opt->prompt.empty() && opt->prompt_ids.empty()) fail("give a prompt: --prompt TEXT or --prompt-ids 1,2,3");
    run_generate(*opt);
  });
}

}  // namespace pagoda::cli
