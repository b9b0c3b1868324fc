// `pagoda serve`: the OpenAI-compatible server over a model on the CPU or the
// GPU (runner_flags.h checks --device, --load-format, --kv-cache-dtype, ...;
// backend/registry.h turns them into the model runner and its KV geometry).
//
//   pagoda serve --model models/pagoda-tiny --port 8000 [--api-keys keys.json]
//   pagoda serve --model DIR --device cuda --kv-cache-dtype fp8 --gpu-memory-utilization 0.9
//
// The start-up report (device, weights, KV dtype and bytes per token, pool
// tokens, concurrent requests at max_model_len) goes to stderr.
// Prints "pagoda serve: listening on http://HOST:PORT" once it accepts
// connections (with --port 0 the kernel picks the port). SIGTERM or SIGINT:
// stop accepting, let in-flight requests finish for --shutdown-grace seconds,
// abort the rest, exit 0.

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "pagoda/chat/chat_template.h"
#include "pagoda/cli/commands.h"
#include "pagoda/backend/registry.h"
#include "pagoda/cli/http_front_flags.h"
#include "pagoda/cli/kv_tier_flags.h"
#include "pagoda/cli/kv_compression_flags.h"
#include "pagoda/cli/runner_flags.h"
#include "pagoda/runtime/kv_sizing.h"
#include "pagoda/cli/tokenizer_text_decoder.h"
#include "pagoda/engine/engine.h"
#include "pagoda/grammar/token_vocabulary.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/server/openai_server.h"
#include "pagoda/tokenizer/tokenizer.h"
#include "pagoda/server/tokenizer_fingerprint.h"

namespace pagoda::cli {
namespace {

volatile std::sig_atomic_t g_received_signal = 0;

struct ServeOptions {
  RunnerFlags runner;
  KvCompressionFlags kv_compression;
  KvTierFlags kv_tiers;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_keys_file;
  std::string served_model_name;
  int32_t max_queued = 256;
  bool no_prefix_cache = false;
  bool no_kv_events = false;
  int http_threads = 2;
  HttpFrontFlags http;
  int64_t max_request_cost = server::kDefaultMaxRequestCost;
  int32_t prefix_share_min_tokens = 0;
  double ttft_floor_ms = 0;
  std::string ttft_floor_scope = "all";
  std::string scheduling_policy = "fcfs";
  std::string grammar_cache_memory = "256MiB";
  bool no_jump_forward = false;
  server::TenantLimits tenant_limits;  // defaults for tenants whose api-keys entry sets none
};

void run_serve(const ServeOptions& opt) {
  namespace fs = std::filesystem;
  auto flags = resolve_runner_flags(opt.runner, RunnerCommand::kServe);
  if (!flags.ok()) fail(flags.status().to_string());
  auto kv_compression = resolve_kv_compression_flags(opt.kv_compression, flags->device, flags->kv_cross_layer_share);
  if (!kv_compression.ok()) fail(kv_compression.status().to_string());
  auto preemption = resolve_preemption_mode(opt.runner, *flags);
  if (!preemption.ok()) fail(preemption.status().to_string());
  if (opt.max_queued < 0) fail(fmt::format("--max-queued {}: must be >= 0", opt.max_queued));

  // SIGTERM/SIGINT only set a flag (async-signal-safe, whichever thread gets
  // it); a watcher thread does the shutdown outside the handler.
  struct sigaction action {};
  action.sa_handler = [](int sig) { g_received_signal = sig; };
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that leaves mid-write is an error return, not a crash
  signal(SIGXFSZ, SIG_IGN);  // a file past the size limit (disk KV tier) is an error return, not a crash

  backend::RunnerRequirements needs;
  needs.progress = [](const std::string& line) { std::fprintf(stderr, "pagoda serve: %s\n", line.c_str()); };
  auto setup = backend::create_model_runner(*flags, needs);
  if (!setup.ok()) fail("loading the model: " + setup.status().to_string());
  {
    std::istringstream report(setup->report);
    for (std::string line; std::getline(report, line);) std::fprintf(stderr, "pagoda serve: %s\n", line.c_str());
    std::fprintf(stderr, "pagoda serve: preemption by %s\n", std::string(engine::preemption_mode_name(*preemption)).c_str());
  }

  // Tokenizer and chat template are optional (fixture models and bare config files have neither).
  const std::string& model_dir = flags->model_dir;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  if (!model_dir.empty() && fs::exists(fs::path(model_dir) / "tokenizer.json")) {
    auto loaded = tokenizer::Tokenizer::load(model_dir);
    if (!loaded.ok()) fail("loading tokenizer: " + loaded.status().to_string());
    tok = *loaded;
  }
  std::optional<chat::ChatTemplate> chat_template;
  if (tok) {
    auto loaded = chat::ChatTemplate::load_from_model_dir(model_dir);
    if (loaded.ok())
      chat_template = std::move(*loaded);
    else if (loaded.status().code() != StatusCode::kNotFound)
      fail("loading chat template: " + loaded.status().to_string());
  }

  kv::KvCacheConfig kv_config = kv_cache_config(*setup, !opt.no_prefix_cache);
  // Block events feed GET /v1/kv/events (a KV-aware `pagoda route` reads them).
  kv_config.record_events = !opt.no_kv_events;
  if (opt.prefix_share_min_tokens < 0 || opt.prefix_share_min_tokens % kv_config.block_size != 0)
    fail(fmt::format("--prefix-share-min-tokens {}: must be 0 or a positive multiple of the KV block size {}",
                     opt.prefix_share_min_tokens, kv_config.block_size));
  kv_config.prefix_share_min_tokens = opt.prefix_share_min_tokens;
  // Tiers below the host (disk, redis); they outlive the engine (declared first).
  auto lower_tiers = open_kv_tiers(opt.kv_tiers, *setup, kv_config, [](const std::string& line) {
    std::fprintf(stderr, "pagoda serve: warning: %s\n", line.c_str());
  });
  if (!lower_tiers.ok()) fail(lower_tiers.status().to_string());
  if (*lower_tiers)
    std::fprintf(stderr, "pagoda serve: KV tiers below the host: %s; blocks are written through the host tier\n",
                 (*lower_tiers)->describe().c_str());
  auto kv = kv::KvCacheManager::create(kv_config);
  if (!kv.ok()) fail("KV cache: " + kv.status().to_string());

  server::ServerConfig server_config;
  // Default id: the model directory's name ("pagoda-tiny"); for a bare config file its stem
  // ("llama3_8b_config"), or its directory's name when the file is a plain config.json.
  fs::path model_path = fs::path(model_dir.empty() ? flags->config_path : model_dir).lexically_normal();
  if (model_dir.empty() && model_path.filename() == "config.json") model_path = model_path.parent_path();
  server_config.model_name = !opt.served_model_name.empty() ? opt.served_model_name
                             : model_dir.empty()            ? model_path.stem().string()
                                                            : model_path.filename().string();
  if (server_config.model_name.empty()) server_config.model_name = model_path.parent_path().filename();
  server_config.publish_kv_events = !opt.no_kv_events;
  if (!model_dir.empty()) {
    auto fingerprint = server::tokenizer_fingerprint(model_dir);
    if (!fingerprint.ok()) fail("tokenizer fingerprint: " + fingerprint.status().to_string());
    server_config.tokenizer_fingerprint = *fingerprint;
  }
  server_config.host = opt.host;
  server_config.port = opt.port;
  if (opt.http_threads < 1) fail(fmt::format("--http-threads {}: must be >= 1", opt.http_threads));
  if (Status s = apply_http_front_flags(opt.http, "--max-connections", server_config.http, &server_config.shutdown_grace);
      !s.ok())
    fail(s.message());
  server_config.http_threads = opt.http_threads;
  server_config.max_request_cost = opt.max_request_cost;
  if (!(opt.ttft_floor_ms >= 0 && opt.ttft_floor_ms <= 600'000))
    fail(fmt::format("--cache-hit-ttft-floor-ms {}: must be in [0, 600000]", opt.ttft_floor_ms));
  if (opt.ttft_floor_scope != "all" && opt.ttft_floor_scope != "hits")
    fail(fmt::format("--cache-hit-ttft-floor-scope '{}': must be 'all' or 'hits'", opt.ttft_floor_scope));
  server_config.first_token_floor = std::chrono::milliseconds(static_cast<int64_t>(opt.ttft_floor_ms));
  server_config.first_token_floor_hits_only = opt.ttft_floor_scope == "hits";
  server_config.priority_scheduling = opt.scheduling_policy == "priority";
  auto grammar_bytes = parse_byte_size(opt.grammar_cache_memory);
  if (!grammar_bytes.ok() || *grammar_bytes < 0)
    fail(fmt::format("--grammar-cache-memory '{}': {}", opt.grammar_cache_memory,
                     grammar_bytes.ok() ? "must be >= 0" : grammar_bytes.status().message()));
  server_config.grammar_cache_memory_bytes = static_cast<size_t>(*grammar_bytes);
  server_config.jump_forward = !opt.no_jump_forward;
  if (!opt.api_keys_file.empty()) {
    auto keys = server::ApiKeyStore::load(opt.api_keys_file);
    if (!keys.ok()) fail(keys.status().to_string());
    server_config.api_keys = std::move(*keys);
  }
  if (opt.tenant_limits.max_requests_in_flight < 0 || opt.tenant_limits.tokens_per_minute < 0 ||
      opt.tenant_limits.max_kv_blocks < 0)
    fail("--tenant-max-requests, --tenant-tokens-per-minute and --tenant-max-kv-blocks must be >= 0");
  server_config.default_tenant_limits = opt.tenant_limits;
  // Each tenant becomes a namespace group with its KV cap (0: none) in the KV
  // manager, before the engine thread owns it: the cap counts the tenant's own
  // namespace and every salted user namespace of it together.
  for (const std::string& tenant : server_config.api_keys.tenants()) {
    server::TenantLimits limits = opt.tenant_limits;
    for (const auto& [name, set] : server_config.api_keys.tenant_limits())
      if (name == tenant) limits = set;
    if (Status s = (*kv)->set_namespace_block_limit(server::ApiKeyStore::cache_namespace(tenant), limits.max_kv_blocks);
        !s.ok())
      fail(s.to_string());
  }

  engine::EngineConfig engine_config;
  engine_config.scheduler = scheduler_config(*setup, *preemption);
  engine_config.scheduler.prefill_join_limit = opt.runner.prefill_join_limit;
  engine_config.scheduler.max_prompt_rows_per_step =
      max_prompt_rows_per_step(opt.runner, setup->runner->capabilities().scores_on_device);
  engine_config.overlap_steps = overlap_steps(opt.runner);
  engine_config.kv_compression = *kv_compression;
  if (kv_compression->enabled() && !setup->runner->capabilities().compacts_kv)
    fail(fmt::format("--kv-compression {}: this model cannot run token eviction (MLA, sliding-window attention, or --tensor-parallel-size above 1 on cpu)",
                     opt.kv_compression.policy));
  engine_config.max_queued_requests = opt.max_queued;
  engine_config.lower_tiers = lower_tiers->get();
  server::TextCodec codec;
  if (tok) {
    engine_config.text_decoder_factory = make_tokenizer_text_decoder_factory(tok);
    codec.encode = [tok](std::string_view text, bool special) { return tok->encode(text, special); };
    codec.token_text = [tok](int32_t t) { return tok->decode(std::span<const int32_t>(&t, 1), false); };
    codec.decode = [tok](std::span<const int32_t> ids) { return tok->decode(ids, false); };
    codec.vocabulary = grammar::TokenVocabulary::from_tokenizer(*tok);
  }
  if (chat_template) codec.render_chat = server::make_chat_renderer(std::move(*chat_template));

  auto created = engine::Engine::create(engine_config, *setup->runner, **kv);
  if (!created.ok()) fail(created.status().to_string());
  engine::Engine& engine = **created;
  std::fprintf(stderr, "pagoda serve: engine steps: %s (--overlap-steps %s)\n",
               engine.overlaps_steps() ? "overlapped (the next step is planned while the device runs this one)"
                                       : "one at a time",
               opt.runner.overlap_steps.c_str());
  engine.start();
  server::OpenAiServer server(server_config, engine, codec);
  auto port = server.bind();
  if (!port.ok()) {
    engine.shutdown(std::chrono::milliseconds(0));
    fail(port.status().to_string());
  }
  std::atomic<bool> exiting{false};
  std::thread signal_thread([&] {
    while (!exiting) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int sig = g_received_signal;
      if (sig != 0) {
        std::fprintf(stderr, "pagoda serve: signal %d, draining\n", sig);
        server.begin_drain();
        server.stop();
        engine.shutdown(server_config.shutdown_grace);
        return;
      }
    }
  });
  std::printf("pagoda serve: model '%s' on %s, %d KV blocks of %d tokens (%s), context %d, listening on "
              "http://%s:%d\n", server_config.model_name.c_str(), std::string(backend::device_name(flags->device)).c_str(),
              setup->num_blocks, setup->block_size, opt.no_prefix_cache ? "prefix cache off" : "prefix cache on",
              engine.max_context_length(), opt.host.c_str(), *port);
  std::fflush(stdout);
  Status served = server.serve();
  exiting = true;
  signal_thread.join();
  engine.shutdown(std::chrono::milliseconds(0));
  if (!served.ok()) fail(served.to_string());
  std::fprintf(stderr, "pagoda serve: stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto opt = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
      "/tokenize, /detokenize, /health, /metrics; docs/API.md).\n"
      "  pagoda serve --model models/pagoda-tiny --port 8000\n"
      "  pagoda serve --model DIR --device cuda --kv-cache-dtype fp8 --gpu-memory-utilization 0.9\n"
      "Prints 'listening on http://HOST:PORT' on stdout once it accepts connections; the model/device/KV report "
      "goes to stderr.");
  add_runner_flags(*cmd, opt->runner, RunnerCommand::kServe);
  add_kv_compression_flags(*cmd, opt->kv_compression);
  add_kv_tier_flags(*cmd, opt->kv_tiers);
  cmd->add_option("--host", opt->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", opt->port, "Port (0: any free port, printed at start)")->capture_default_str();
  cmd->add_option("--api-keys", opt->api_keys_file,
                  "JSON {\"keys\": [{\"key\": \"sk-...\", \"tenant\": \"name\"}]}; requires Bearer auth on /v1. "
                  "A key with \"admin\": true may also read every tenant's KV events and the load (for pagoda route)");
  cmd->add_option("--served-model-name", opt->served_model_name, "Model id clients send (default: directory name)");
  cmd->add_option("--max-queued", opt->max_queued, "Most requests waiting to start; past it, 429")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", opt->no_prefix_cache, "Disable prefix caching (benchmark baseline)");
  cmd->add_option("--grammar-cache-memory", opt->grammar_cache_memory,
                  "Most memory the cached compiled grammars of structured outputs hold together (e.g. 256MiB); "
                  "past it the least recently used are dropped")
      ->capture_default_str();
  cmd->add_flag("--no-jump-forward", opt->no_jump_forward,
                "Structured outputs: sample every token, also where the grammar allows one continuation only "
                "(default: that text is appended as the tokenizer's tokens without a forward pass each)");
  cmd->add_flag("--no-kv-events", opt->no_kv_events,
                "Publish no KV block events (GET /v1/kv/events, read by a kv-aware `pagoda route`)");
  cmd->add_option("--http-threads", opt->http_threads,
                  "Threads that parse, tokenize and submit requests (streams need none: the HTTP front is event-driven)")
      ->capture_default_str();
  add_http_front_flags(*cmd, opt->http, "--max-connections");
  cmd->add_option("--tenant-max-requests", opt->tenant_limits.max_requests_in_flight,
                  "Requests one tenant may have in flight (queued or running); past it, 429 (0: no cap; an api-keys "
                  "entry's \"limits\" override the --tenant-* defaults)")
      ->capture_default_str();
  cmd->add_option("--tenant-tokens-per-minute", opt->tenant_limits.tokens_per_minute,
                  "Tokens (prompt + n x max_tokens reserved, unused given back) one tenant may use per minute; past "
                  "it, 429 with Retry-After (0: no cap)")
      ->capture_default_str();
  cmd->add_option("--tenant-max-kv-blocks", opt->tenant_limits.max_kv_blocks,
                  "KV blocks one tenant may hold, in use or cached; at the cap it recycles its own cache, never "
                  "others' (0: no cap)")
      ->capture_default_str();
  cmd->add_option("--prefix-share-min-tokens", opt->prefix_share_min_tokens,
                  "Use prefix-cache hits only in whole units of this many tokens, none below one unit (0: off; a "
                  "multiple of the KV block size): a short probe cannot test a guess")
      ->capture_default_str();
  cmd->add_option("--cache-hit-ttft-floor-ms", opt->ttft_floor_ms,
                  "Send no first token (or non-streamed answer) earlier than this many ms after the request "
                  "arrived, so prefix-cache hits look like misses up to that time (0: off)")
      ->capture_default_str();
  cmd->add_option("--cache-hit-ttft-floor-scope", opt->ttft_floor_scope,
                  "Which requests wait for the floor: 'all' (hides hits for every prompt whose miss is quicker than "
                  "the floor) or 'hits' (cheaper; a hit can then come later than its miss)")
      ->capture_default_str();
  cmd->add_option("--scheduling-policy", opt->scheduling_policy,
                  "fcfs: first come, first served; priority: requests may carry \"priority\" (lower is admitted "
                  "first and preempted last, FCFS within a priority; an api key's limits.min_priority bounds it)")
      ->check(CLI::IsMember({"fcfs", "priority"}))
      ->capture_default_str();
  cmd->add_option("--max-request-cost", opt->max_request_cost,
                  "Most n x max_tokens x (1 + logprobs) one request may ask for; past it, 400 (0: no cap)")
      ->capture_default_str();
  cmd->callback([opt] {
    if (opt->runner.model.empty() && opt->runner.config_file.empty())
      fail("--model is required: a Hugging Face model directory (or, with --load-format random, a config.json)");
    run_serve(*opt);
  });
}

}  // namespace pagoda::cli
