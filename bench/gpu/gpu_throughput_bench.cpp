// pagoda_gpu_bench: end-to-end figures of the CUDA backend on one GPU.
//
//   latency     batch-1 decode: ms per output token (CUDA graphs on and off)
//               against the floor of reading every weight once per token.
//   throughput  N requests of random prompts, all arriving at t=0, served by a
//               small continuous-batching loop inside this binary (NOT the
//               engine): every step decodes all running sequences and fills
//               the rest of the token budget with whole prompts of newly
//               admitted requests; KV blocks are reserved for prompt + output
//               at admission. Output tok/s, TTFT and inter-token latency.
//
//   pagoda_gpu_bench --config tools/gpu_backend/llama3_8b_config.json --load-format random
//     pagoda_gpu_bench ... --mode throughput --num-requests 1000 --input-len 1000 --output-len 1000

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "pagoda/backend/cuda/cuda_model.h"
#include "pagoda/backend/cuda/cuda_model_runner.h"
#include "pagoda/backend/cuda/fast_attention.h"

namespace {

using Clock = std::chrono::steady_clock;
using pagoda::ForwardBatch;
using pagoda::SequenceSlice;
using pagoda::cuda::CudaModel;
using pagoda::cuda::CudaModelOptions;
using pagoda::cuda::CudaModelRunner;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())));
  return v[i];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

[[noreturn]] void die(const pagoda::Status& s, const char* what) {
  std::fprintf(stderr, "error: %s: %s\n", what, s.to_string().c_str());
  std::exit(1);
}

struct Args {
  std::string model_dir, config_path, load_format = "auto", mode = "throughput", json_out;
  int num_requests = 1000, input_len = 1000, output_len = 1000;
  int max_num_seqs = 256, max_num_tokens = 8192, block_size = 16;
  double gpu_memory_utilization = 0.9, max_seconds = 300;
  uint64_t seed = 1;
  int max_graph_batch = -1;  // -1: choose from the decode sweep
  std::string fast_attention = "auto";
  std::string kv_cache_dtype = "bf16";  // K and V pools: bf16, fp8, int8 or int4
};

// One request of the throughput run.
struct Request {
  std::vector<int32_t> prompt;
  std::vector<int32_t> blocks;
  int32_t generated = 0;
  int32_t last_token = 0;
  double first_token_s = -1, last_token_s = 0;
};

nlohmann::json run_latency(CudaModelRunner& runner, const Args& args) {
  CudaModel& model = runner.model();
  std::mt19937 rng(static_cast<uint32_t>(args.seed));
  std::uniform_int_distribution<int32_t> token(0, model.config().vocab_size - 1);
  const int32_t prompt_len = std::min(args.input_len, 512);
  const int32_t steps = std::min(args.output_len, 256);
  const int32_t total = prompt_len + steps + 1;
  std::vector<int32_t> table((total + args.block_size - 1) / args.block_size);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);

  nlohmann::json out;
  for (bool graphs : {true, false}) {
    model.set_use_cuda_graphs(graphs);
    ForwardBatch batch;
    for (int32_t i = 0; i < prompt_len; ++i) {
      batch.token_ids.push_back(token(rng));
      batch.positions.push_back(i);
    }
    SequenceSlice s;
    s.num_new_tokens = prompt_len;
    s.block_table = table;
    batch.sequences.push_back(s);
    const auto t_prefill = Clock::now();
    auto first = runner.execute_greedy(batch);
    if (!first.ok()) die(first.status(), "prefill");
    const double prefill_ms = seconds_since(t_prefill) * 1e3;
    int32_t next = (*first)[0];
    std::vector<double> step_ms;
    for (int32_t i = 0; i < steps; ++i) {
      ForwardBatch d;
      d.token_ids = {next};
      d.positions = {prompt_len + i};
      SequenceSlice ds;
      ds.num_new_tokens = 1;
      ds.num_cached_tokens = prompt_len + i;
      ds.block_table = table;
      d.sequences.push_back(ds);
      const auto t0 = Clock::now();
      auto tok = runner.execute_greedy(d);
      if (!tok.ok()) die(tok.status(), "decode");
      step_ms.push_back(seconds_since(t0) * 1e3);
      next = (*tok)[0];
    }
    // The first steps include graph capture; report the steady state.
    const std::vector<double> steady(step_ms.begin() + std::min<size_t>(8, step_ms.size() / 2), step_ms.end());
    const double weight_gb = static_cast<double>(model.weight_bytes()) / 1e9;
    const double floor_ms = weight_gb / 4300.0 * 1e3;  // bytes / (4.3 TB/s measured copy bandwidth)
    const double p50 = percentile(steady, 50);
    nlohmann::json r = {{"cuda_graphs", graphs},          {"prompt_tokens", prompt_len},
                        {"decode_steps", steps},          {"prefill_ms", prefill_ms},
                        {"decode_ms_mean", mean(steady)}, {"decode_ms_p50", p50},
                        {"decode_ms_p90", percentile(steady, 90)}, {"weight_gb", weight_gb},
                        {"weight_read_floor_ms", floor_ms}, {"effective_weight_bandwidth_gbs", weight_gb / (p50 / 1e3)},
                        {"fraction_of_floor", floor_ms / p50}};
    std::printf("latency (batch 1, graphs %s): prefill %d tokens %.1f ms; decode p50 %.3f ms/token (mean %.3f, "
                "p90 %.3f); floor %.3f ms (%.2f GB at 4.3 TB/s) -> %.0f%% of the floor, %.0f GB/s\n",
                graphs ? "on" : "off", prompt_len, prefill_ms, p50, mean(steady), percentile(steady, 90), floor_ms,
                weight_gb, 100.0 * floor_ms / p50, weight_gb / (p50 / 1e3));
    out[graphs ? "graphs_on" : "graphs_off"] = r;
  }
  model.set_use_cuda_graphs(true);
  return out;
}

// Checks backend/cuda/attention's attention and the backend's own kernel, each against a
// float64 CPU reference at this model's attention shape (FastAttention::
// check_attention_kernels), and turns fast attention off if it misses the
// kernels' bound. The two kernels' logits through the whole model are only
// reported: on a deep random-weight model bf16 roundings compound, so two
// correct kernels differ there by a few percent (docs/KERNELS.md).
nlohmann::json check_fast_attention(CudaModelRunner& runner, const Args& args) {
  CudaModel& model = runner.model();
  auto check = pagoda::cuda::FastAttention::check_attention_kernels(model.config(), args.block_size);
  if (!check.ok()) die(check.status(), "attention check");
  const bool on = check->fast_ok();
  std::printf("attention check vs float64 (relative L2, bound %.0e): backend/cuda/attention %s prefill %.2e decode %.2e; builtin "
              "prefill %.2e decode %.2e -> %s\n", pagoda::cuda::AttentionCheck::kBound,
              check->fast_available ? "" : "(not available for this shape)", check->fast_prefill, check->fast_decode,
              check->builtin_prefill, check->builtin_decode,
              on ? "fast attention ON (graphs and eager steps)" : "builtin attention only");

  // For the record: the two kernels through the whole model (two prompts, all logits).
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> token(0, model.config().vocab_size - 1);
  ForwardBatch batch;
  int32_t next_block = 0;
  for (int32_t len : {200, 77}) {
    SequenceSlice s;
    s.token_offset = batch.num_tokens();
    s.num_new_tokens = len;
    for (int32_t i = 0; i < len; ++i) {
      batch.token_ids.push_back(token(rng));
      batch.positions.push_back(i);
    }
    for (int32_t b = 0; b < (len + args.block_size - 1) / args.block_size; ++b) s.block_table.push_back(next_block++);
    batch.sequences.push_back(s);
  }
  double err = 0, scale = 0;
  if (check->fast_available) {
    model.set_fast_attention(true);
    auto fast = runner.execute(batch, {});
    model.set_fast_attention(false);
    auto builtin = runner.execute(batch, {});
    if (!fast.ok() || !builtin.ok()) die(fast.ok() ? builtin.status() : fast.status(), "attention check");
    for (size_t i = 0; i < fast->host_logits.size(); ++i) {
      err = std::max(err, static_cast<double>(std::abs(fast->host_logits[i] - builtin->host_logits[i])));
      scale = std::max(scale, static_cast<double>(std::abs(builtin->host_logits[i])));
    }
    std::printf("attention check: whole model, max |fast - builtin| logit %.4g (max |logit| %.3g; information only)\n",
                err, scale);
  }
  model.set_fast_attention(on);
  return {{"fast_attention_available", check->fast_available}, {"fast_prefill_rel_l2", check->fast_prefill},
          {"fast_decode_rel_l2", check->fast_decode}, {"builtin_prefill_rel_l2", check->builtin_prefill},
          {"builtin_decode_rel_l2", check->builtin_decode}, {"bound", pagoda::cuda::AttentionCheck::kBound},
          {"model_max_logit_diff_fast_vs_builtin", err}, {"model_max_logit", scale}, {"fast_attention_on", on}};
}

// Static batch: B sequences with `context` cached tokens decode `steps` tokens
// together, timed per step, with (a) graph replay (backend/cuda/attention's graph-mode
// decode when it passed the check, else the backend's attention) and (b) eager
// steps + backend/cuda/attention's attention.
nlohmann::json run_decode_sweep(CudaModelRunner& runner, const Args& args) {
  CudaModel& model = runner.model();
  const bool fast_ok = model.options().fast_attention;
  const int32_t context = 1024, steps = 24;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, model.config().vocab_size - 1);
  nlohmann::json out = nlohmann::json::array();
  for (int32_t batch_size : {1, 64, std::min(256, args.max_num_seqs)}) {
    const int32_t blocks_each = (context + steps + args.block_size) / args.block_size;
    if (static_cast<int64_t>(blocks_each) * batch_size > runner.num_blocks()) break;
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch_size));
    for (int32_t s = 0; s < batch_size; ++s)
      for (int32_t b = 0; b < blocks_each; ++b) tables[s].push_back(s * blocks_each + b);
    // Prefill the contexts in chunks of whole prompts.
    for (int32_t first = 0; first < batch_size;) {
      ForwardBatch batch;
      while (first < batch_size && batch.num_tokens() + context <= args.max_num_tokens) {
        SequenceSlice s;
        s.token_offset = batch.num_tokens();
        s.num_new_tokens = context;
        s.block_table = tables[first++];
        for (int32_t i = 0; i < context; ++i) {
          batch.token_ids.push_back(token(rng));
          batch.positions.push_back(i);
        }
        batch.sequences.push_back(s);
      }
      auto r = runner.execute_greedy(batch);
      if (!r.ok()) die(r.status(), "sweep prefill");
    }
    for (int variant = 0; variant < (fast_ok ? 2 : 1); ++variant) {
      const bool graphs = variant == 0;
      model.set_use_cuda_graphs(graphs);
      model.set_fast_attention(!graphs || fast_ok);  // graphs run backend/cuda/attention's decode too when it passed the check
      std::vector<double> ms;
      for (int32_t step = 0; step < steps; ++step) {
        ForwardBatch batch;
        for (int32_t s = 0; s < batch_size; ++s) {
          SequenceSlice slice;
          slice.token_offset = s;
          slice.num_new_tokens = 1;
          slice.num_cached_tokens = context + step;
          slice.block_table = tables[s];
          batch.sequences.push_back(slice);
          batch.token_ids.push_back(token(rng));
          batch.positions.push_back(context + step);
        }
        const auto t0 = Clock::now();
        auto r = runner.execute_greedy(batch);
        if (!r.ok()) die(r.status(), "sweep decode");
        ms.push_back(seconds_since(t0) * 1e3);
      }
      const std::vector<double> steady(ms.begin() + 4, ms.end());
      const double p50 = percentile(steady, 50);
      const double kv_gb = 2.0 * model.config().num_layers * model.config().num_kv_heads * model.config().head_dim * 2 *
                           static_cast<double>(context + steps / 2) * batch_size / 1e9;
      std::printf("decode sweep: batch %3d, context %d, %s: %.3f ms/step p50 -> %.0f tok/s (KV %.1f GB + weights "
                  "%.1f GB per step)\n", batch_size, context,
                  graphs ? (fast_ok ? "CUDA graph + backend/cuda/attention attention" : "CUDA graph + builtin attention")
                         : "eager + backend/cuda/attention attention", p50,
                  batch_size / (p50 / 1e3), kv_gb, model.weight_bytes() / 1e9);
      out.push_back({{"batch", batch_size}, {"context", context}, {"graphs", graphs}, {"fast_attention", !graphs || fast_ok},
                     {"ms_per_step_p50", p50}, {"tok_per_s", batch_size / (p50 / 1e3)}, {"kv_gb_per_step", kv_gb}});
    }
  }
  model.set_use_cuda_graphs(true);
  model.set_fast_attention(fast_ok);
  return out;
}

nlohmann::json run_throughput(CudaModelRunner& runner, const Args& args) {
  CudaModel& model = runner.model();
  const int32_t bs = args.block_size;
  const int32_t blocks_per_request = (args.input_len + args.output_len + bs - 1) / bs;
  std::mt19937 rng(static_cast<uint32_t>(args.seed));
  std::uniform_int_distribution<int32_t> token(0, model.config().vocab_size - 1);
  std::vector<Request> requests(static_cast<size_t>(args.num_requests));
  for (Request& r : requests) {
    r.prompt.resize(static_cast<size_t>(args.input_len));
    for (int32_t& t : r.prompt) t = token(rng);
  }
  std::vector<int32_t> free_blocks(static_cast<size_t>(runner.num_blocks()));
  for (size_t i = 0; i < free_blocks.size(); ++i) free_blocks[i] = static_cast<int32_t>(free_blocks.size() - 1 - i);
  const int32_t max_concurrent =
      std::min<int32_t>(args.max_num_seqs, runner.num_blocks() / blocks_per_request);
  std::printf("throughput: %d requests x %d in / %d out; at most %d running (max_num_seqs %d, KV room for %d)\n",
              args.num_requests, args.input_len, args.output_len, max_concurrent, args.max_num_seqs,
              runner.num_blocks() / blocks_per_request);
  if (max_concurrent < 1) {
    std::fprintf(stderr, "error: not even one request fits in the KV pool\n");
    std::exit(1);
  }

  std::deque<size_t> waiting;
  for (size_t i = 0; i < requests.size(); ++i) waiting.push_back(i);
  std::vector<size_t> running;
  std::vector<double> itl_ms;
  int64_t steps = 0, decode_only_steps = 0, output_tokens = 0, prompt_tokens = 0;
  size_t finished = 0;
  bool timed_out = false;
  const auto t0 = Clock::now();
  while (finished < requests.size()) {
    if (seconds_since(t0) > args.max_seconds) {
      timed_out = true;
      break;
    }
    ForwardBatch batch;
    std::vector<size_t> order;  // request of each sequence slice
    auto add_slice = [&](size_t id, const std::vector<int32_t>& tokens, int32_t cached) {
      SequenceSlice s;
      s.token_offset = batch.num_tokens();
      s.num_new_tokens = static_cast<int32_t>(tokens.size());
      s.num_cached_tokens = cached;
      s.block_table = requests[id].blocks;
      for (size_t i = 0; i < tokens.size(); ++i) {
        batch.token_ids.push_back(tokens[i]);
        batch.positions.push_back(cached + static_cast<int32_t>(i));
      }
      batch.sequences.push_back(std::move(s));
      order.push_back(id);
    };
    for (size_t id : running) {
      const Request& r = requests[id];
      add_slice(id, {r.last_token}, args.input_len + r.generated - 1);
    }
    const size_t num_decodes = running.size();
    while (!waiting.empty() && static_cast<int32_t>(running.size() + (order.size() - num_decodes)) < max_concurrent &&
           batch.num_tokens() + args.input_len <= args.max_num_tokens &&
           static_cast<int32_t>(free_blocks.size()) >= blocks_per_request) {
      const size_t id = waiting.front();
      waiting.pop_front();
      requests[id].blocks.assign(free_blocks.end() - blocks_per_request, free_blocks.end());
      free_blocks.resize(free_blocks.size() - static_cast<size_t>(blocks_per_request));
      add_slice(id, requests[id].prompt, 0);
      prompt_tokens += args.input_len;
    }
    if (order.size() == num_decodes) ++decode_only_steps;
    auto sampled = runner.execute_greedy(batch);
    if (!sampled.ok()) die(sampled.status(), "step");
    ++steps;
    const double now = seconds_since(t0);
    std::vector<size_t> still_running;
    for (size_t i = 0; i < order.size(); ++i) {
      Request& r = requests[order[i]];
      r.last_token = (*sampled)[i];
      ++r.generated;
      ++output_tokens;
      if (r.first_token_s < 0) {
        r.first_token_s = now;
      } else {
        itl_ms.push_back((now - r.last_token_s) * 1e3);
      }
      r.last_token_s = now;
      if (r.generated >= args.output_len) {
        free_blocks.insert(free_blocks.end(), r.blocks.begin(), r.blocks.end());
        ++finished;
      } else {
        still_running.push_back(order[i]);
      }
    }
    running = std::move(still_running);
  }
  const double wall = seconds_since(t0);
  std::vector<double> ttft_ms;
  for (const Request& r : requests)
    if (r.first_token_s >= 0) ttft_ms.push_back(r.first_token_s * 1e3);
  nlohmann::json out = {
      {"num_requests", args.num_requests}, {"input_len", args.input_len}, {"output_len", args.output_len},
      {"finished_requests", finished}, {"timed_out", timed_out}, {"max_concurrent", max_concurrent},
      {"wall_s", wall}, {"steps", steps}, {"decode_only_steps", decode_only_steps},
      {"output_tokens", output_tokens}, {"prompt_tokens", prompt_tokens},
      {"output_tok_per_s", output_tokens / wall}, {"total_tok_per_s", (output_tokens + prompt_tokens) / wall},
      {"ttft_ms_mean", mean(ttft_ms)}, {"ttft_ms_p50", percentile(ttft_ms, 50)},
      {"ttft_ms_p99", percentile(ttft_ms, 99)}, {"itl_ms_mean", mean(itl_ms)},
      {"itl_ms_p50", percentile(itl_ms, 50)}, {"itl_ms_p99", percentile(itl_ms, 99)},
      {"graph_replays", model.graph_replays()}, {"fast_attention_steps", model.fast_attention_steps()},
      {"max_graph_batch", model.options().max_graph_batch}};
  std::printf("throughput: %zu/%d requests finished in %.1f s%s: %.0f output tok/s (%.0f total tok/s); TTFT mean "
              "%.0f ms p50 %.0f p99 %.0f; ITL mean %.1f ms p50 %.1f p99 %.1f; %lld steps (%lld decode-only, %lld graph "
              "replays)\n", finished, args.num_requests, wall, timed_out ? " (TIME LIMIT)" : "",
              output_tokens / wall, (output_tokens + prompt_tokens) / wall, mean(ttft_ms), percentile(ttft_ms, 50),
              percentile(ttft_ms, 99), mean(itl_ms), percentile(itl_ms, 50), percentile(itl_ms, 99),
              static_cast<long long>(steps), static_cast<long long>(decode_only_steps),
              static_cast<long long>(model.graph_replays()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"pagoda_gpu_bench: end-to-end latency and throughput of the CUDA backend"};
  app.add_option("--model", args.model_dir, "model directory (config.json + safetensors)");
  app.add_option("--config", args.config_path, "config.json for --load-format random");
  app.add_option("--load-format", args.load_format, "auto (checkpoint) or random")->check(CLI::IsMember({"auto", "random"}));
  app.add_option("--mode", args.mode, "latency, sweep (static-batch decode), throughput or all")
      ->check(CLI::IsMember({"latency", "sweep", "throughput", "all"}));
  app.add_option("--max-graph-batch", args.max_graph_batch,
                 "decode batches above this run eagerly (0: all graphs; -1: choose from the sweep)");
  app.add_option("--fast-attention", args.fast_attention, "backend/cuda/attention attention (graphs and eager steps): auto "
                 "(each kernel checked against a float64 reference first) or off")
      ->check(CLI::IsMember({"auto", "off"}));
  app.add_option("--num-requests", args.num_requests)->check(CLI::PositiveNumber);
  app.add_option("--input-len", args.input_len)->check(CLI::PositiveNumber);
  app.add_option("--output-len", args.output_len)->check(CLI::PositiveNumber);
  app.add_option("--max-num-seqs", args.max_num_seqs)->check(CLI::PositiveNumber);
  app.add_option("--max-num-tokens", args.max_num_tokens)->check(CLI::PositiveNumber);
  app.add_option("--gpu-memory-utilization", args.gpu_memory_utilization)->check(CLI::Range(0.01, 1.0));
  app.add_option("--max-seconds", args.max_seconds, "stop the throughput run after this long and report");
  app.add_option("--seed", args.seed);
  app.add_option("--kv-cache-dtype", args.kv_cache_dtype, "KV cache element type (K and V): bf16, fp8, int8, int4")
      ->check(CLI::IsMember({"bf16", "fp8", "int8", "int4"}));
  app.add_option("--json", args.json_out, "write the figures as JSON here");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress survives a timeout kill

  CudaModelOptions options;
  options.max_num_seqs = args.max_num_seqs;
  options.max_num_tokens = std::max(args.max_num_tokens, args.input_len);
  options.max_model_len = std::max(args.input_len + args.output_len, 512 + 256 + 1);
  options.block_size = args.block_size;
  options.max_graph_batch = std::max(args.max_graph_batch, 0);
  options.fast_attention = args.fast_attention != "off";
  options.kv_key_dtype = options.kv_value_dtype = *pagoda::dtype_from_name(args.kv_cache_dtype);
  const auto t_load = Clock::now();
  pagoda::StatusOr<std::unique_ptr<CudaModel>> model = pagoda::Status(pagoda::StatusCode::kInvalidArgument, "");
  if (args.load_format == "random") {
    if (args.config_path.empty()) {
      std::fprintf(stderr, "error: --load-format random needs --config\n");
      return 2;
    }
    std::ifstream in(args.config_path);
    if (!in) {
      std::fprintf(stderr, "error: cannot read %s\n", args.config_path.c_str());
      return 2;
    }
    auto config = pagoda::parse_model_config(nlohmann::json::parse(in, nullptr, false), args.config_path);
    if (!config.ok()) die(config.status(), "config");
    model = CudaModel::create_random(*config, args.seed, options);
  } else {
    if (args.model_dir.empty()) {
      std::fprintf(stderr, "error: --model is required (or --load-format random --config FILE)\n");
      return 2;
    }
    model = CudaModel::load(args.model_dir, options);
  }
  if (!model.ok()) die(model.status(), "model");
  const double load_s = seconds_since(t_load);
  std::printf("model: %s, %d layers, hidden %d, heads %d/%d, vocab %d; %.2f GB bf16 weights on the GPU in %.1f s\n",
              (*model)->config().architecture_name.c_str(), (*model)->config().num_layers,
              (*model)->config().hidden_size, (*model)->config().num_q_heads, (*model)->config().num_kv_heads,
              (*model)->config().vocab_size, (*model)->weight_bytes() / 1e9, load_s);
  pagoda::cuda::CudaRunnerOptions runner_options;
  runner_options.gpu_memory_utilization = args.gpu_memory_utilization;
  auto runner = CudaModelRunner::create(std::move(model).value(), runner_options);
  if (!runner.ok()) die(runner.status(), "KV pool");

  nlohmann::json figures = {{"kv_pool", (*runner)->kv_pool_report()}, {"weight_load_s", load_s}};
  // Written after every phase, so a later failure keeps what was measured.
  auto save = [&] {
    if (!args.json_out.empty()) std::ofstream(args.json_out) << figures.dump(2) << "\n";
  };
  save();
  if (args.fast_attention != "off") figures["attention_check"] = check_fast_attention(**runner, args);
  save();
  if (args.mode == "latency" || args.mode == "all") figures["latency"] = run_latency(**runner, args);
  save();
  if (args.mode == "sweep" || args.mode == "all") {
    figures["decode_sweep"] = run_decode_sweep(**runner, args);
    if (args.max_graph_batch < 0) {
      // Graphs for every measured batch size up to the first one where eager
      // steps with backend/cuda/attention's attention are faster.
      int32_t limit = 0;  // 0: graphs for all
      double graph_ms = 0;
      for (const auto& r : figures["decode_sweep"]) {
        if (r["graphs"].get<bool>()) {
          graph_ms = r["ms_per_step_p50"].get<double>();
        } else if (r["ms_per_step_p50"].get<double>() < graph_ms) {
          limit = std::max(1, r["batch"].get<int32_t>() / 2);
          break;
        }
      }
      (*runner)->model().set_max_graph_batch(limit);
      figures["chosen_max_graph_batch"] = limit;
      std::printf("decode sweep: graphs for decode batches up to %s, eager + backend/cuda/attention attention above\n",
                  limit == 0 ? "max_num_seqs" : std::to_string(limit).c_str());
    }
  }
  save();
  if (args.mode == "throughput" || args.mode == "all") figures["throughput"] = run_throughput(**runner, args);
  save();
  return 0;
}
