// pagoda: one binary, one subcommand per job. See `pagoda --help`.

#include <cstdio>
#include <iostream>

#include "pagoda/cli/commands.h"
#include "pagoda/core/version.h"

namespace pagoda::cli {

void fail(const std::string& message, int exit_code) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  throw CLI::RuntimeError(exit_code);
}

std::string compiled_backends() {
#ifdef PAGODA_HAVE_CUDA
  return "cpu, cuda";
#else
  return "cpu";
#endif
}

}  // namespace pagoda::cli

int main(int argc, char** argv) {
  using namespace pagoda::cli;
  CLI::App app{
      "pagoda: an LLM inference engine built around the KV cache.\n"
      "Loads Hugging Face checkpoints (config.json + safetensors + tokenizer.json) and runs them.\n"
      "Start with `pagoda generate --model models/<name> --prompt \"Hello\"`; every subcommand has --help."};
  app.set_version_flag("--version", std::string("pagoda ") + pagoda::kVersion +
                                        " (backends: " + compiled_backends() + ")");
  app.require_subcommand(1);
#ifdef PAGODA_HAVE_GENERATE_COMMAND
  add_generate_command(app);
#endif
#ifdef PAGODA_HAVE_KVCALC_COMMAND
  add_kvcalc_command(app);
#endif
#ifdef PAGODA_HAVE_TOKENIZE_COMMAND
  add_tokenize_command(app);
#endif
#ifdef PAGODA_HAVE_RENDER_CHAT_COMMAND
  add_render_chat_command(app);
#endif
#ifdef PAGODA_HAVE_SERVE_COMMAND
  add_serve_command(app);
#endif
#ifdef PAGODA_HAVE_EVAL_COMMAND
  add_eval_command(app);
#endif
#ifdef PAGODA_HAVE_BENCH_COMMAND
  add_bench_command(app);
#endif
#ifdef PAGODA_HAVE_ROUTE_COMMAND
  add_route_command(app);
#endif
  CLI11_PARSE(app, argc, argv);
  return 0;
}
