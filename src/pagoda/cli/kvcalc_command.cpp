// pagoda kvcalc: how much KV cache a model needs, per token, per request and per
// batch, for every KV dtype and attention kind, and how much fits in a budget.

#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/cli/commands.h"
#include "pagoda/runtime/cross_layer_share.h"
#include "pagoda/runtime/kv_sizing.h"

namespace pagoda::cli {
namespace {

struct KvcalcOptions {
  std::string config_path;
  std::string model_dir;
  int64_t layers = 0, heads = 0, kv_heads = 0, head_dim = 0, v_head_dim = 0;
  int64_t kv_lora_rank = 0, qk_rope_dim = 0;
  int64_t tokens = 4096;
  int64_t batch = 1;
  int64_t block_size = 16;
  std::string memory;
  std::vector<std::string> dtypes = {"bf16", "fp8", "int8", "int4"};
  bool compare = false;
  bool json = false;
  int64_t cross_layer_share = 1;  // --kv-cross-layer-share (runtime/cross_layer_share.h)
};

KvShape shape_from_options(const KvcalcOptions& o) {
  if (!o.config_path.empty() || !o.model_dir.empty()) {
    std::string path = o.config_path.empty() ? o.model_dir + "/config.json" : o.config_path;
    std::ifstream in(path);
    if (!in) fail(fmt::format("cannot open '{}'", path));
    nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) fail(fmt::format("'{}' is not valid JSON", path));
    auto shape = kv_shape_from_config(config);
    if (!shape.ok()) fail(fmt::format("{}: {}", path, shape.status().message()));
    return *shape;
  }
  KvShape s;
  s.layers = o.layers;
  s.query_heads = o.heads > 0 ? o.heads : o.kv_heads;
  if (o.kv_lora_rank > 0) {
    s.mla_latent_dim = o.kv_lora_rank;
    s.mla_rope_dim = o.qk_rope_dim;
    s.head_dim = o.head_dim;  // the per-head K / V dims, for the MHA comparison (optional)
    s.v_head_dim = o.v_head_dim;
    if (s.layers <= 0) fail("--layers must be positive");
    if (s.query_heads <= 0) s.query_heads = 1;
    return s;
  }
  s.kv_heads = o.kv_heads;
  s.head_dim = o.head_dim;
  s.v_head_dim = o.v_head_dim;
  if (s.layers <= 0 || s.kv_heads <= 0 || s.head_dim <= 0)
    fail("give --config FILE, --model DIR, or all of --layers, --kv-heads and --head-dim (positive)");
  if (s.query_heads < s.kv_heads || s.query_heads % s.kv_heads != 0)
    fail(fmt::format("--heads {} must be a positive multiple of --kv-heads {}", s.query_heads, s.kv_heads));
  return s;
}

// The same model geometry under the other attention kinds, for comparison.
std::vector<KvShape> comparison_shapes(const KvShape& s) {
  std::vector<KvShape> out;
  if (s.is_mla()) return {s, mha_equivalent(s)};
  KvShape mha = s, mqa = s, mla = s;
  mha.kv_heads = s.query_heads;
  mqa.kv_heads = 1;
  mla.mla_latent_dim = 512;  // DeepSeek-V2/V3's kv_lora_rank
  mla.mla_rope_dim = 64;     // and qk_rope_head_dim
  out.push_back(mha);
  if (s.kv_heads != s.query_heads && s.kv_heads != 1) out.push_back(s);
  if (s.query_heads > 1) out.push_back(mqa);
  out.push_back(mla);
  return out;
}

std::string describe(const KvShape& s) {
  if (s.is_mla()) {
    std::string mha;
    if (s.head_dim > 0)
      mha = fmt::format("; MHA with {} heads x ({} K + {} V) would cache {}", s.query_heads, s.head_dim,
                        s.v_head_dim > 0 ? s.v_head_dim : s.head_dim,
                        format_with_commas(mha_equivalent(s).values_per_token_per_layer()));
    return fmt::format("{} layers, MLA latent {} + rope {} = {} values per token per layer{}", s.layers,
                       s.mla_latent_dim, s.mla_rope_dim, s.values_per_token_per_layer(), mha);
  }
  return fmt::format("{} layers, {} query heads, {} KV heads ({}), head dim {}", s.layers, s.query_heads,
                     s.kv_heads, attention_kind_name(s.kind()), s.head_dim);
}

void run_kvcalc(const KvcalcOptions& o) {
  KvShape shape = shape_from_options(o);
  if (o.cross_layer_share != 1) {
    if (o.cross_layer_share > INT32_MAX) fail(fmt::format("--kv-cross-layer-share {}: too large", o.cross_layer_share));
    const Status valid = runtime::validate_cross_layer_share(static_cast<int32_t>(o.cross_layer_share),
                                                             static_cast<int32_t>(shape.layers), "--kv-cross-layer-share");
    if (!valid.ok()) fail(valid.message());
    if (shape.is_mla()) fail(fmt::format("--kv-cross-layer-share {}: not for an MLA model", o.cross_layer_share));
  }
  // The base of "vs base" is the unshared model in bf16, so a shared row shows its saving.
  const int64_t bf16_bytes = kv_bytes_per_token(shape, DType::kBF16);
  shape.cross_layer_share = o.cross_layer_share;
  if (o.tokens <= 0) fail(fmt::format("--tokens must be positive, got {}", o.tokens));
  if (o.batch <= 0) fail(fmt::format("--batch must be positive, got {}", o.batch));
  if (o.block_size <= 0 || o.block_size > 256) fail(fmt::format("--block-size must be 1..256, got {}", o.block_size));
  std::optional<int64_t> budget;
  if (!o.memory.empty()) {
    auto b = parse_byte_size(o.memory);
    if (!b.ok()) fail("--memory: " + b.status().message());
    budget = *b;
  }
  // Each entry is one dtype for K and V, or a "K/V" pair such as int8/int4.
  std::vector<std::pair<DType, DType>> dtypes;
  auto parse_dtype = [](const std::string& name) {
    auto d = dtype_from_name(name);
    if (!d) fail(fmt::format("--kv-dtype: unknown dtype '{}' (use f32, bf16, f16, fp8, int8, int4, or K/V like int8/int4)", name));
    return *d;
  };
  for (const auto& name : o.dtypes) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos) {
      const DType d = parse_dtype(name);
      dtypes.emplace_back(d, d);
    } else {
      dtypes.emplace_back(parse_dtype(name.substr(0, slash)), parse_dtype(name.substr(slash + 1)));
    }
  }
  // Paging rounds each request up to whole blocks.
  int64_t request_tokens = (o.tokens + o.block_size - 1) / o.block_size * o.block_size;

  // An MLA model always shows what MHA caching of it would take beside it.
  std::vector<KvShape> shapes = o.compare || (shape.is_mla() && shape.head_dim > 0) ? comparison_shapes(shape)
                                                                                     : std::vector<KvShape>{shape};
  nlohmann::json rows = nlohmann::json::array();
  for (const KvShape& s : shapes) {
    for (const auto& [k, v] : dtypes) {
      int64_t per_token = kv_bytes_per_token(s, k, v);
      const std::string label =
          k == v || s.is_mla() ? std::string(dtype_name(k)) : fmt::format("{}/{}", dtype_name(k), dtype_name(v));
      nlohmann::json row = {{"attention", attention_kind_name(s.kind())},
                            {"kv_heads", s.is_mla() ? 0 : s.kv_heads},
                            {"values_per_token_per_layer", s.values_per_token_per_layer()},
                            {"kv_dtype", label},
                            {"key_dtype", dtype_name(k)},
                            {"value_dtype", s.is_mla() ? dtype_name(k) : dtype_name(v)},
                            {"cross_layer_share", s.cross_layer_share},
                            {"bytes_per_token", per_token},
                            {"ratio_to_bf16", static_cast<double>(bf16_bytes) / per_token},
                            {"bytes_per_request", per_token * request_tokens},
                            {"bytes_per_batch", per_token * request_tokens * o.batch}};
      if (budget) {
        auto capacity = kv_capacity(s, k, v, *budget, o.block_size, o.tokens);
        if (!capacity.ok()) fail("--memory: " + capacity.status().message());
        row["tokens_in_budget"] = capacity->tokens;
        row["requests_in_budget"] = capacity->requests;
        row["startup_line"] = format_kv_cache_line(s, k, v, *budget, o.block_size);
      }
      rows.push_back(row);
    }
  }

  if (o.json) {
    nlohmann::json out = {{"model", describe(shape)}, {"tokens_per_request", o.tokens},
                          {"batch", o.batch}, {"block_size", o.block_size}, {"rows", rows}};
    if (budget) out["memory_budget_bytes"] = *budget;
    std::cout << out.dump() << "\n";
    return;
  }
  std::cout << fmt::format("model: {}\n", describe(shape));
  if (shape.cross_layer_share > 1) {
    const runtime::CrossLayerShare share{static_cast<int32_t>(shape.layers), static_cast<int32_t>(shape.cross_layer_share)};
    std::cout << fmt::format("cross-layer share {}: layers {}-{} in groups of {}, {} of {} layers' K/V stored, plus "
                             "per-token norms (2 x {} f32 per KV head per shared slot)\n",
                             shape.cross_layer_share, share.first_shared(), shape.layers - 1, shape.cross_layer_share,
                             share.num_slots(), shape.layers, share.norm_record());
  }
  std::cout << fmt::format("request: {} tokens ({} after rounding to blocks of {}), batch of {}\n", o.tokens,
                           request_tokens, o.block_size, o.batch);
  if (budget) std::cout << fmt::format("budget: {} ({} bytes)\n", format_bytes(static_cast<double>(*budget)), *budget);
  std::cout << "values: cached values per token per layer (K + V over the KV heads, or the MLA latent + rope)\n";
  std::cout << "vs base: how many times smaller than the given model's KV in bf16\n";
  std::cout << "scales included: fp8 one f32 per token-head; int8 f16 scale + zero per token-head; "
               "int4 f16 scale + zero per 32 values; an MLA latent in fp8 is FlashMLA's record: one f32 per 128 "
               "latent values, the rope key in bf16, padded to 16 bytes (656 B for 512 + 64)\n\n";
  std::string header = fmt::format("{:<5} {:>4} {:>7} {:<9} {:>14} {:>8} {:>12} {:>12}", "attn", "kv", "values",
                                   "dtype", "bytes/token", "vs base", "per request", "per batch");
  if (budget) header += fmt::format(" {:>16} {:>10}", "tokens that fit", "requests");
  std::cout << header << "\n";
  for (const auto& r : rows) {
    std::string line = fmt::format(
        "{:<5} {:>4} {:>7} {:<9} {:>14} {:>7.2f}x {:>12} {:>12}", r["attention"].get<std::string>(),
        r["kv_heads"].get<int64_t>() == 0 ? std::string("-") : std::to_string(r["kv_heads"].get<int64_t>()),
        r["values_per_token_per_layer"].get<int64_t>(), r["kv_dtype"].get<std::string>(), format_with_commas(r["bytes_per_token"].get<int64_t>()), r["ratio_to_bf16"].get<double>(),
        format_bytes(r["bytes_per_request"].get<double>()), format_bytes(r["bytes_per_batch"].get<double>()));
    if (budget)
      line += fmt::format(" {:>16} {:>10}", format_with_commas(r["tokens_in_budget"].get<int64_t>()),
                          format_with_commas(r["requests_in_budget"].get<int64_t>()));
    std::cout << line << "\n";
  }
}

}  // namespace

void add_kvcalc_command(CLI::App& app) {
  auto opts = std::make_shared<KvcalcOptions>();
  CLI::App* cmd = app.add_subcommand(
      "kvcalc",
      "KV-cache size per token, request and batch for each KV dtype (and attention kind with --compare),\n"
      "and how many tokens / requests fit in --memory. Example:\n"
      "  pagoda kvcalc --layers 80 --heads 64 --kv-heads 8 --head-dim 128 --tokens 131072 --memory 80GiB --compare");
  cmd->add_option("--config", opts->config_path, "a Hugging Face config.json")->check(CLI::ExistingFile);
  cmd->add_option("--model", opts->model_dir, "a model directory holding config.json")->check(CLI::ExistingDirectory);
  cmd->add_option("--layers", opts->layers, "number of layers (without --config)");
  cmd->add_option("--kv-cross-layer-share", opts->cross_layer_share,
                  "K > 1: groups of K upper layers store one merged K/V plus per-token norms (as pagoda generate / "
                  "serve / eval --kv-cross-layer-share)")
      ->capture_default_str();
  cmd->add_option("--heads", opts->heads, "query heads (default: --kv-heads)");
  cmd->add_option("--kv-heads", opts->kv_heads, "key/value heads: = heads for MHA, 1 for MQA");
  cmd->add_option("--head-dim", opts->head_dim, "dimension of one head");
  cmd->add_option("--v-head-dim", opts->v_head_dim, "value head dimension when it differs from --head-dim");
  cmd->add_option("--kv-lora-rank", opts->kv_lora_rank, "MLA latent dimension (makes the model MLA)");
  cmd->add_option("--qk-rope-dim", opts->qk_rope_dim, "MLA decoupled rope key dimension");
  cmd->add_option("--tokens", opts->tokens, "tokens per request (default 4096)");
  cmd->add_option("--batch", opts->batch, "requests in a batch (default 1)");
  cmd->add_option("--block-size", opts->block_size, "KV block size in tokens; requests round up to blocks (default 16)");
  cmd->add_option("--memory", opts->memory, "KV memory budget, e.g. 80GiB or 16GB");
  cmd->add_option("--kv-dtype,--kv-cache-dtype", opts->dtypes,
                  "KV dtypes to show, comma-separated; K/V pairs like int8/int4 (default: bf16,fp8,int8,int4)")
      ->delimiter(',');
  cmd->add_flag("--compare", opts->compare, "also show the same model as MHA, MQA and MLA (latent 512 + rope 64)");
  cmd->add_flag("--json", opts->json, "print one JSON object instead of a table");
  cmd->callback([opts] { run_kvcalc(*opts); });
}

}  // namespace pagoda::cli
