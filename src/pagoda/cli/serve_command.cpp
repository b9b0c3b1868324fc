// `pagoda serve`: the OpenAI-compatible server over the CPU model.
//
//   pagoda serve --model models/pagoda-tiny --port 8000 [--api-keys keys.json]
//
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
#include <thread>

#include <nlohmann/json.hpp>

#include "pagoda/chat/chat_template.h"
#include "pagoda/cli/commands.h"
#include "pagoda/engine/cpu_model_runner.h"
#include "pagoda/engine/engine.h"
#include "pagoda/kv/kv_cache_manager.h"
#include "pagoda/model/cpu_model.h"
#include "pagoda/server/openai_server.h"
#include "pagoda/tokenizer/tokenizer.h"

namespace pagoda::cli {
namespace {

volatile std::sig_atomic_t g_received_signal = 0;

struct ServeOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_keys_file;
  std::string served_model_name;
  int32_t max_running = 64;
  int32_t max_queued = 256;
  int32_t block_size = 16;
  int64_t kv_cache_memory = 256ll << 20;
  int32_t max_tokens_per_step = 512;
  int32_t max_model_len = 0;
  bool no_prefix_cache = false;
  int http_threads = 0;
  double shutdown_grace_s = 10.0;
};

class TokenizerTextDecoder final : public engine::TextDecoder {
 public:
  explicit TokenizerTextDecoder(std::shared_ptr<const tokenizer::Tokenizer> tok)
      : tok_(std::move(tok)), detok_(*tok_, /*skip_special_tokens=*/true) {}
  std::string append(int32_t token) override { return detok_.feed(token); }
  std::string finish() override { return detok_.flush(); }

 private:
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  tokenizer::IncrementalDetokenizer detok_;
};

void run_serve(const ServeOptions& opt) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(opt.model_dir)) fail("--model " + opt.model_dir + ": not a directory");
  if (opt.block_size < 1 || opt.block_size > 256) fail("--block-size must be in [1, 256]");
  if (opt.max_running < 1) fail("--max-running must be >= 1");
  if (opt.max_queued < 0) fail("--max-queued must be >= 0");
  if (opt.max_tokens_per_step < 1) fail("--max-tokens-per-step must be >= 1");

  // SIGTERM/SIGINT only set a flag (async-signal-safe, whichever thread gets
  // it); a watcher thread does the shutdown outside the handler.
  struct sigaction action {};
  action.sa_handler = [](int sig) { g_received_signal = sig; };
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that leaves mid-write is an error return, not a crash

  auto model = CpuModel::load(opt.model_dir);
  if (!model.ok()) fail("loading model: " + model.status().to_string());
  if (opt.max_model_len > 0) {
    // Lets a benchmark run past the trained context (quality is then not the point).
    const_cast<ModelConfig&>((*model)->config()).max_position_embeddings = opt.max_model_len;
  }
  const int64_t num_blocks = engine::CpuModelRunner::blocks_for_memory(**model, opt.kv_cache_memory, opt.block_size);
  if (num_blocks < 1) fail("--kv-cache-memory " + std::to_string(opt.kv_cache_memory) + " holds no KV block");
  if (num_blocks > INT32_MAX) fail("--kv-cache-memory is too large");

  // Tokenizer and chat template are optional (fixture models have neither).
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  if (fs::exists(fs::path(opt.model_dir) / "tokenizer.json")) {
    auto loaded = tokenizer::Tokenizer::load(opt.model_dir);
    if (!loaded.ok()) fail("loading tokenizer: " + loaded.status().to_string());
    tok = *loaded;
  }
  std::optional<chat::ChatTemplate> chat_template;
  if (tok) {
    auto loaded = chat::ChatTemplate::load_from_model_dir(opt.model_dir);
    if (loaded.ok())
      chat_template = std::move(*loaded);
    else if (loaded.status().code() != StatusCode::kNotFound)
      fail("loading chat template: " + loaded.status().to_string());
  }

  auto runner = engine::CpuModelRunner::create(std::move(*model), static_cast<int32_t>(num_blocks), opt.block_size);
  if (!runner.ok()) fail("allocating the KV pool: " + runner.status().to_string());
  kv::KvCacheConfig kv_config;
  kv_config.num_blocks = static_cast<int32_t>(num_blocks);
  kv_config.block_size = opt.block_size;
  kv_config.enable_prefix_cache = !opt.no_prefix_cache;
  kv_config.record_events = false;
  auto kv = kv::KvCacheManager::create(kv_config);
  if (!kv.ok()) fail("KV cache: " + kv.status().to_string());

  server::ServerConfig server_config;
  server_config.model_name =
      opt.served_model_name.empty() ? fs::path(opt.model_dir).lexically_normal().filename().string()
                                    : opt.served_model_name;
  if (server_config.model_name.empty()) server_config.model_name = fs::path(opt.model_dir).parent_path().filename();
  server_config.host = opt.host;
  server_config.port = opt.port;
  server_config.http_threads = opt.http_threads > 0 ? opt.http_threads : opt.max_running + opt.max_queued + 8;
  if (!opt.api_keys_file.empty()) {
    auto keys = server::ApiKeyStore::load(opt.api_keys_file);
    if (!keys.ok()) fail(keys.status().to_string());
    server_config.api_keys = std::move(*keys);
  }

  engine::EngineConfig engine_config;
  engine_config.scheduler.max_running_sequences = opt.max_running;
  engine_config.scheduler.max_tokens_per_step = opt.max_tokens_per_step;
  engine_config.max_queued_requests = opt.max_queued;
  server::TextCodec codec;
  if (tok) {
    engine_config.text_decoder_factory = [tok](std::span<const int32_t>) {
      return std::make_unique<TokenizerTextDecoder>(tok);
    };
    codec.encode = [tok](std::string_view text, bool special) { return tok->encode(text, special); };
    codec.token_text = [tok](int32_t t) { return tok->decode(std::span<const int32_t>(&t, 1), false); };
  }
  if (chat_template) codec.render_chat = server::make_chat_renderer(std::move(*chat_template));

  engine::Engine engine(engine_config, **runner, **kv);
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
        engine.shutdown(std::chrono::milliseconds(static_cast<int64_t>(opt.shutdown_grace_s * 1000)));
        return;
      }
    }
  });
  std::printf("pagoda serve: model '%s', %lld KV blocks of %d tokens (%s), context %d, listening on http://%s:%d\n",
              server_config.model_name.c_str(), static_cast<long long>(num_blocks), opt.block_size,
              opt.no_prefix_cache ? "prefix cache off" : "prefix cache on", engine.max_context_length(),
              opt.host.c_str(), *port);
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
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model", opt->model_dir, "Model directory (config.json, safetensors, tokenizer.json)")->required();
  cmd->add_option("--host", opt->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", opt->port, "Port (0: any free port, printed at start)")->capture_default_str();
  cmd->add_option("--api-keys", opt->api_keys_file,
                  "JSON {\"keys\": [{\"key\": \"sk-...\", \"tenant\": \"name\"}]}; requires Bearer auth on /v1");
  cmd->add_option("--served-model-name", opt->served_model_name, "Model id clients send (default: directory name)");
  cmd->add_option("--max-running", opt->max_running, "Most sequences in one batch")->capture_default_str();
  cmd->add_option("--max-queued", opt->max_queued, "Most requests waiting to start; past it, 429")
      ->capture_default_str();
  cmd->add_option("--block-size", opt->block_size, "Tokens per KV block")->capture_default_str();
  cmd->add_option("--kv-cache-memory", opt->kv_cache_memory, "Bytes of KV cache memory")->capture_default_str();
  cmd->add_option("--max-tokens-per-step", opt->max_tokens_per_step,
                  "Token budget of one engine step (prefill chunks + decodes)")
      ->capture_default_str();
  cmd->add_option("--max-model-len", opt->max_model_len, "Override the context length (benchmarks)");
  cmd->add_flag("--no-prefix-cache", opt->no_prefix_cache, "Disable prefix caching (benchmark baseline)");
  cmd->add_option("--http-threads", opt->http_threads, "HTTP worker threads (default: max-running + max-queued + 8)");
  cmd->add_option("--shutdown-grace", opt->shutdown_grace_s, "Seconds in-flight requests get on SIGTERM")
      ->capture_default_str();
  cmd->callback([opt] { run_serve(*opt); });
}

}  // namespace pagoda::cli
