// `pagoda generate`: one prompt, one sequence, on the CPU reference model or
// the GPU (--device cuda), through the same engine, KV manager and
// ModelRunner as `pagoda serve` (driven step by step on this thread). The
// shortest path from a checkpoint to tokens, and what the reference tests'
// numbers can be reproduced with by hand. Tokens are chosen by the engine's
// sampler (greedy at temperature 0; otherwise min-p, top-k, top-p, seeded).

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
#include "pagoda/backend/registry.h"
#include "pagoda/cli/kv_compression_flags.h"
#include "pagoda/cli/runner_flags.h"
#include "pagoda/cli/tokenizer_text_decoder.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::cli {

namespace {

struct GenerateOptions {
  RunnerFlags runner;
  KvCompressionFlags kv_compression;
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
  auto kv_compression = resolve_kv_compression_flags(opt.kv_compression, flags->device, flags->kv_cross_layer_share);
  if (!kv_compression.ok()) fail(kv_compression.status().to_string());
  auto preemption = resolve_preemption_mode(opt.runner, *flags);
  if (!preemption.ok()) fail(preemption.status().to_string());
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
  backend::RunnerRequirements needs;
  needs.min_kv_tokens = total;
  needs.sequence_tokens = static_cast<int32_t>(total);
  needs.prompt_tokens = static_cast<int32_t>(prompt.size());
  needs.progress = progress;
  const auto load_start = Clock::now();
  auto setup = backend::create_model_runner(*flags, needs);
  if (!setup.ok()) {
    if (setup.status().code() != StatusCode::kOutOfRange) fail(setup.status().to_string());
    fail(setup.status()
             .with_context(fmt::format("prompt ({} tokens) + --max-tokens {}", prompt.size(), opt.max_tokens))
             .to_string());
  }
  const ModelConfig& config = setup->config;
  std::istringstream report(setup->report);
  for (std::string line; std::getline(report, line);) progress(line);
  progress(fmt::format("ready in {:.2f} s", seconds_since(load_start)));

  for (int32_t id : prompt)
    if (id >= config.vocab_size)
      fail(fmt::format("prompt token id {} is outside the model's vocabulary [0, {})", id, config.vocab_size));
  if (opt.logprobs > 0) sampling.logprobs = opt.logprobs;
  sampling.seed = opt.seed;
  sampling.ignore_eos = opt.ignore_eos;
  if (Status valid = engine::validate_sampling_params(sampling, config.vocab_size); !valid.ok())
    fail("sampling flags: " + valid.to_string());

  // The engine as serve runs it; the whole prompt goes in one forward.
  auto kv = kv::KvCacheManager::create(kv_cache_config(*setup, /*enable_prefix_cache=*/false));
  if (!kv.ok()) fail("KV cache: " + kv.status().to_string());
  engine::EngineConfig engine_config;
  engine_config.scheduler = scheduler_config(*setup, *preemption);
  engine_config.kv_compression = *kv_compression;
  engine_config.overlap_steps = overlap_steps(opt.runner);
  if (kv_compression->enabled() && !setup->runner->capabilities().compacts_kv)
    fail(fmt::format("--kv-compression {}: this model cannot run token eviction (MLA, sliding-window attention, or --tensor-parallel-size above 1 on cpu)",
                     opt.kv_compression.policy));
  engine_config.scheduler.max_running_sequences = 1;
  engine_config.scheduler.max_tokens_per_step =
      std::max<int32_t>(engine_config.scheduler.max_tokens_per_step, static_cast<int32_t>(prompt.size()));
  engine_config.max_queued_requests = 1;
  if (tok) engine_config.text_decoder_factory = make_tokenizer_text_decoder_factory(tok);
  auto created = engine::Engine::create(engine_config, *setup->runner, **kv);
  if (!created.ok()) fail(created.status().to_string());
  engine::Engine& engine = **created;

  engine::GenerationRequest request;
  request.prompt_tokens = prompt;
  request.sampling = sampling;
  auto stream = engine.submit(std::move(request));
  if (!stream.ok()) fail(stream.status().to_string());

  std::vector<int32_t> generated;
  nlohmann::json top_logprobs = nlohmann::json::array();
  auto add_logprobs = [&](const engine::SampledToken& t) {
    nlohmann::json step = nlohmann::json::array();
    for (const auto& alt : t.top_logprobs) step.push_back({alt.token, alt.logprob});
    top_logprobs.push_back(step);
  };
  const bool print_text = tok && !opt.json;
  const auto prefill_start = Clock::now();
  double prefill_seconds = 0;
  Clock::time_point decode_start;
  bool finished = false;
  while (!finished) {
    engine.step();
    while (auto out = (*stream)->next(std::chrono::milliseconds(0))) {
      if (out->failed()) fail("generation failed: " + out->error);
      for (const engine::ChoiceDelta& delta : out->choices) {
        const size_t before = generated.size();
        generated.insert(generated.end(), delta.tokens.begin(), delta.tokens.end());
        for (const engine::SampledToken& t : delta.logprobs) add_logprobs(t);
        if (delta.stop_token) {
          generated.push_back(delta.stop_token->token);
          if (opt.logprobs > 0) add_logprobs(*delta.stop_token);
        }
        if (before == 0 && !generated.empty()) {
          prefill_seconds = seconds_since(prefill_start);
          decode_start = Clock::now();
        }
        if (print_text) std::cout << delta.text << std::flush;
      }
      finished |= out->finished;
    }
  }
  const double decode_seconds = generated.empty() ? 0.0 : seconds_since(decode_start);
  if (print_text) std::cout << std::endl;

  const size_t decode_steps = generated.size() > 0 ? generated.size() - 1 : 0;
  progress(fmt::format("prefill {} tokens in {:.3f} s ({:.1f} tok/s); decode {} tokens in {:.3f} s ({:.1f} tok/s)",
                       prompt.size(), prefill_seconds, prompt.size() / std::max(prefill_seconds, 1e-9),
                       decode_steps, decode_seconds, decode_steps / std::max(decode_seconds, 1e-9)));

  if (opt.json) {
    nlohmann::json out = {{"tokens", generated}};
    if (opt.logprobs > 0) out["logprobs"] = top_logprobs;
    if (tok) out["text"] = tok->decode(generated, /*skip_special_tokens=*/true);
    std::cout << out.dump() << std::endl;
  } else if (!tok) {
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
  add_kv_compression_flags(*cmd, opt->kv_compression);
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
  cmd->add_option("--logprobs", opt->logprobs, "report the top K (<= 20) log-probabilities of every step")
      ->check(CLI::Range(0, 20));
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
