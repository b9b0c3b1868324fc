#pragma once
// Each subcommand of the `pagoda` binary lives in its own <name>_command.cpp and
// adds itself to the app through one of these functions. A command reports
// failure by throwing CLI::RuntimeError(exit_code) after printing a clear
// message to stderr (CLI11 turns that into the process exit code).

#include <CLI/CLI.hpp>

namespace pagoda::cli {

void add_generate_command(CLI::App& app);
void add_kvcalc_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_render_chat_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_route_command(CLI::App& app);

// Prints "error: <message>" to stderr and throws CLI::RuntimeError(exit_code).
[[noreturn]] void fail(const std::string& message, int exit_code = 1);

// Backends compiled into this binary, e.g. "cpu" or "cpu, cuda".
std::string compiled_backends();

}  // namespace pagoda::cli
