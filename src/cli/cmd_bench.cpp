// `lragent bench trace`: multi-agent ReAct traces of the LRAgent poster's lengths on synthetic
// models with real shapes (model/presets.h), under every KV sharing mode. Prints the poster's
// table; writes JSON (bench/trace/report.py merges it with the HF peer's) and markdown.
// docs/bench.md defines the traces and every metric.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "agents/trace_bench.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/presets.h"

namespace lragent::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPosterLengths = "1900,3000,5000,9100,17300,33700,66400";
constexpr const char* kTrajectoriesFile = "bench/trace/trajectories.json";

struct BenchFlags {
  std::string preset = "tiny";
  std::string modes = "none,full,droidspeak,base,base-lr";
  std::string lengths = kPosterLengths;
  std::string adapters = "shared";
  int rank = 16;
  double kv_budget_gb = 0;
  std::string json_file, markdown_file, dump_traces;
  bool dump_only = false;
  bool agents_curve = false;
  int64_t curve_length = 0;
  int max_agents = 16;
  std::string trajectories;
  int trajectory = 0;
  int page_size = 16;
  std::string droidspeak_layers = "0";
  bool no_warmup = false;
  int warmup_runs = 1, runs = 1;
  // Device (as ModelFlags: the backend comes from make_backend).
  std::string device = "cpu", dtype = "bf16";
  bool enforce_eager = false;
  bool no_decode_lookahead = false;
  bool no_kv_evict = false;
  std::string prefill_attention = "v6";
  int threads = 0;
};

// "1900,3.0k,66400" -> {1900, 3000, 66400}.
Result<std::vector<int64_t>> parse_lengths(const std::string& text) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    double scale = 1;
    if (!item.empty() && (item.back() == 'k' || item.back() == 'K')) {
      scale = 1000;
      item.pop_back();
    }
    char* end = nullptr;
    const double v = item.empty() ? -1 : std::strtod(item.c_str(), &end) * scale;
    if (item.empty() || *end != '\0' || v < 1 || v > 1e9 || std::abs(v - std::round(v)) > 1e-6)
      return make_error(ErrorCode::kInvalidArgument, "--lengths: '{}' is not a token count (expected e.g. 1900,3.0k)",
                        text.substr(i, j - i));
    out.push_back(static_cast<int64_t>(std::llround(v)));
    i = j + 1;
  }
  return out;
}

Result<std::vector<ShareMode>> parse_modes(const std::string& text) {
  std::vector<ShareMode> out;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    auto m = parse_share_mode(text.substr(i, j - i));
    if (!m.ok()) return make_error(m.error().code, "--modes: {}", m.error().message);
    if (std::find(out.begin(), out.end(), *m) == out.end()) out.push_back(*m);
    i = j + 1;
  }
  return out;
}

// The trajectory file: --trajectories, else bench/trace/trajectories.json under the working
// directory or beside the binary's build folder (build/lragent -> bench/trace/...).
Result<std::string> find_trajectories(const std::string& flag) {
  if (!flag.empty()) return flag;
  std::vector<fs::path> tried = {fs::path(kTrajectoriesFile)};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) tried.push_back(exe.parent_path().parent_path() / kTrajectoriesFile);
  std::string names;
  for (const auto& p : tried) {
    if (fs::exists(p, ec)) return p.string();
    names += (names.empty() ? "" : ", ") + p.string();
  }
  return make_error(ErrorCode::kNotFound, "cannot find {} (tried {}); pass --trajectories FILE", kTrajectoriesFile, names);
}

Status write_file(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream out(path, std::ios::binary);
  if (out) out << text;
  if (!out) return make_error(ErrorCode::kIo, "{} {}: cannot write the file", flag, path);
  return Status::Ok();
}

// Whether FILE can be written, checked before the benchmark runs (its results would be lost):
// the folder must exist and be writable.
Status check_writable(const std::string& path, const char* flag) {
  if (path.empty()) return Status::Ok();
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0)
    return make_error(ErrorCode::kIo, "{} {}: cannot write there ({} is not a writable folder)", flag, path, dir.string());
  if (fs::is_directory(path, ec)) return make_error(ErrorCode::kIo, "{} {}: is a folder, not a file", flag, path);
  return Status::Ok();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json config_json(const ModelPreset& p) {
  const ModelConfig& c = p.config;
  nlohmann::json rs = nullptr;
  if (!c.rope_scaling.type.empty())
    rs = {{"rope_type", c.rope_scaling.type}, {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor}, {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  return {{"name", p.name}, {"description", p.description}, {"architecture", c.architecture},
          {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_layers}, {"num_attention_heads", c.num_heads},
          {"num_key_value_heads", c.num_kv_heads}, {"head_dim", c.head_dim},
          {"max_position_embeddings", c.max_position_embeddings}, {"rms_norm_eps", c.rms_norm_eps},
          {"rope_theta", c.rope_theta}, {"rope_scaling", rs}, {"tie_word_embeddings", c.tie_word_embeddings},
          {"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_ids}, {"init_std", p.init_std}};
}

// Progress on stderr: one rewritten line on a terminal, one line per cell otherwise.
class Progress {
 public:
  explicit Progress(int total) : total_(total), tty_(isatty(STDERR_FILENO) != 0), t0_(std::chrono::steady_clock::now()) {}
  void cell_done(const TraceCell& c) {
    ++done_;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    constexpr int kWidth = 24;
    const int fill = total_ ? done_ * kWidth / total_ : kWidth;
    const std::string bar = std::string(static_cast<size_t>(fill), '#') + std::string(static_cast<size_t>(kWidth - fill), '.');
    const std::string evicted =
        c.evictions > 0 ? fmt::format(", {} evictions ({} tokens recomputable)", c.evictions, c.evicted_tokens) : "";
    const std::string what = c.status == "ok"
                                 ? fmt::format("ttft {:.3f} s, {:.0f} tok/s{}", c.ttft_s, c.throughput_tok_s, evicted)
                                 : c.status + (c.message.empty() ? "" : ": " + c.message.substr(0, 90));
    fmt::print(stderr, "{}[{}] {}/{} cells, {:.1f} s | {} tokens, {}: {}{}", tty_ ? "\r\033[K" : "", bar, done_, total_, s,
               c.length, share_mode_name(c.mode), what, tty_ && done_ < total_ ? "" : "\n");
  }

 private:
  int total_, done_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point t0_;
};

int run_bench_trace(const BenchFlags& f) {
  // Everything that can be checked without a model first: bad flags fail fast.
  auto preset = model_preset(f.preset);
  if (!preset.ok()) return report(preset.error());
  auto modes = parse_modes(f.modes);
  if (!modes.ok()) return report(modes.error());
  auto lengths = parse_lengths(f.lengths);
  if (!lengths.ok()) return report(lengths.error());
  if (f.adapters != "shared" && f.adapters != "indep")
    return report(make_error(ErrorCode::kInvalidArgument, "--adapters '{}': expected shared or indep", f.adapters));
  auto layers = parse_id_list(f.droidspeak_layers);
  if (!layers.ok())
    return report(make_error(ErrorCode::kInvalidArgument, "--droidspeak-layers '{}': expected layer numbers like 0,5",
                             f.droidspeak_layers));
  const int n_layers = preset->config.num_layers;
  for (size_t i = 0; i < layers->size(); ++i) {
    const int l = (*layers)[i];
    if (l >= n_layers)
      return report(make_error(ErrorCode::kInvalidArgument,
                               "--droidspeak-layers: layer {} is out of range; the {} preset has {} layers (0-{})", l,
                               f.preset, n_layers, n_layers - 1));
    if (std::find(layers->begin(), layers->begin() + static_cast<long>(i), l) != layers->begin() + static_cast<long>(i))
      return report(make_error(ErrorCode::kInvalidArgument, "--droidspeak-layers: layer {} is listed twice", l));
  }
  for (const auto& [file, flag] : {std::pair{&f.json_file, "--json"}, std::pair{&f.markdown_file, "--markdown"},
                                   std::pair{&f.dump_traces, "--dump-traces"}})
    if (auto s = check_writable(*file, flag); !s.ok()) return report(s.error());
  TraceBenchOptions opts;
  opts.page_size = f.page_size;
  opts.droidspeak_layers.assign(layers->begin(), layers->end());
  opts.kv_budget_bytes = static_cast<int64_t>(f.kv_budget_gb * 1e9);
  opts.decode_lookahead = !f.no_decode_lookahead;
  opts.evict_private = !f.no_kv_evict;
  auto traj_file = find_trajectories(f.trajectories);
  if (!traj_file.ok()) return report(traj_file.error());
  auto bundle = load_trajectory_bundle(*traj_file);
  if (!bundle.ok()) return report(bundle.error());
  if (f.trajectory < 0 || f.trajectory >= static_cast<int>(bundle->trajectories.size()))
    return report(make_error(ErrorCode::kInvalidArgument, "--trajectory {}: {} holds trajectories 0-{}", f.trajectory,
                             *traj_file, bundle->trajectories.size() - 1));
  const SourceTrajectory& source = bundle->trajectories[static_cast<size_t>(f.trajectory)];
  const ModelConfig& cfg = preset->config;
  std::vector<Trace> traces;
  for (int64_t len : *lengths) {
    auto t = make_trace(source, len, cfg.vocab_size);
    if (!t.ok()) return report(make_error(t.error().code, "--lengths: {}", t.error().message));
    traces.push_back(std::move(*t));
  }
  const nlohmann::json trace_info = {{"trajectories_file", *traj_file},
                                     {"trajectory_index", f.trajectory},
                                     {"trajectory_id", source.id},
                                     {"bundle_source", bundle->source},
                                     {"agent_calls", traces.front().agent_calls()},
                                     {"generated_tokens", traces.front().generated_tokens()}};
  const nlohmann::json adapters_info = {{"kind", f.adapters == "shared" ? "shared-A" : "independent-A"},
                                        {"rank", f.rank},
                                        {"lora_alpha", 2 * f.rank},
                                        {"targets", {"q_proj", "v_proj"}},
                                        {"agents", {"plan", "action", "reflect"}}};
  if (!f.dump_traces.empty()) {
    nlohmann::json d = {{"format", "lragent-trace-v1"}, {"preset", config_json(*preset)}, {"adapters", adapters_info},
                        {"trace", trace_info}, {"traces", nlohmann::json::array()}};
    for (const Trace& t : traces) d["traces"].push_back(t.to_json());
    if (auto s = write_file(f.dump_traces, d.dump(1) + "\n", "--dump-traces"); !s.ok()) return report(s.error());
    fmt::print(stderr, "wrote {} traces to {}\n", traces.size(), f.dump_traces);
    if (f.dump_only) return 0;
  }

  ModelFlags mf;
  mf.device = f.device;
  mf.dtype = f.dtype;
  mf.enforce_eager = f.enforce_eager;
  mf.prefill_attention = f.prefill_attention;
  mf.threads = f.threads;
  auto be = make_backend(mf);
  if (!be.ok()) return report(be.error());
  Backend& backend = **be;
  fmt::print(stderr, "bench trace: {} on {} ({:.2f} GiB of weights), trajectory {} ({} agent calls)\n", preset->description,
             backend.name(), static_cast<double>(preset_weight_bytes(cfg, backend.weight_dtype())) / (1 << 30), source.id,
             traces.front().agent_calls());
  const auto t_load = std::chrono::steady_clock::now();
  auto model = make_preset_model(*preset, backend);
  if (!model.ok()) return report(model.error());
  auto adapters = make_preset_adapters(cfg, f.rank, f.adapters == "shared", /*seed=*/16);
  std::vector<std::string> names;
  std::vector<const LoraAdapter*> ptrs;
  for (auto& a : adapters) {
    if (Status st = upload_adapter(*a, backend); !st.ok()) return report(st.error());
    names.push_back(a->name);
    ptrs.push_back(a.get());
  }
  backend.synchronize();
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  if (!f.no_warmup) {
    // Untimed: the first forward passes pay one-off costs (kernel loading, allocator growth).
    Trace w = traces.front();
    int calls = 0;
    auto it = std::find_if(w.steps.begin(), w.steps.end(), [&](const TraceStep& s) {
      return s.kind == TraceStep::Kind::kCall && ++calls == 2;
    });
    if (it != w.steps.end()) w.steps.erase(it + 1, w.steps.end());
    w.target_tokens = w.final_tokens();
    auto r = run_trace_cell(**model, names, ptrs, w, modes->front(), opts);
    if (!r.ok())  // its own token count (the cut trace's) would read as one of the lengths asked for
      return report(make_error(r.error().code, "warm-up run (the first two agent calls of the {}-token trace): {}",
                               traces.front().target_tokens, r.error().message));
  }

  nlohmann::json j = {{"benchmark", "lragent bench trace"},
                      {"complete", false},
                      {"date_utc", utc_now()},
                      {"device", backend.name()},
                      {"weight_dtype", dtype_name(backend.weight_dtype())},
                      {"cache_dtype", dtype_name(backend.cache_dtype())},
                      {"preset", config_json(*preset)},
                      {"weight_bytes", preset_weight_bytes(cfg, backend.weight_dtype())},
                      {"model_setup_s", load_s},
                      {"adapters", adapters_info},
                      {"trace", trace_info},
                      {"kv_budget_gb", f.kv_budget_gb > 0 ? nlohmann::json(f.kv_budget_gb) : nlohmann::json(nullptr)},
                      {"kv_evict", !f.no_kv_evict},
                      {"page_size", f.page_size},
                      {"droidspeak_layers", opts.droidspeak_layers},
                      {"warmup_runs_per_cell", f.no_warmup ? 0 : f.warmup_runs},
                      {"timed_runs_per_cell", f.runs},
                      {"modes", nlohmann::json::array()},
                      {"lengths", *lengths},
                      {"cells", nlohmann::json::array()}};
  for (ShareMode m : *modes) j["modes"].push_back(share_mode_name(m));
  if (f.agents_curve) {
    // Counters only (no forward pass): cheap, so it comes first and is in every partial file.
    const int64_t len = f.curve_length > 0 ? f.curve_length : *std::max_element(lengths->begin(), lengths->end());
    nlohmann::json curve = {{"length", len}, {"agents", nlohmann::json::array()}, {"modes", nlohmann::json::object()}};
    for (int n = 1; n <= f.max_agents; ++n) curve["agents"].push_back(n);
    for (ShareMode m : *modes) {
      auto bytes = agents_memory_curve(cfg, ptrs, m, len, f.max_agents, static_cast<int64_t>(dtype_size(backend.cache_dtype())), opts);
      if (!bytes.ok()) return report(bytes.error());
      nlohmann::json arr = nlohmann::json::array();
      for (const CacheBytes& b : *bytes) arr.push_back(cache_bytes_json(b));
      curve["modes"][share_mode_name(m)] = std::move(arr);  // empty: the mode cannot run these adapters
    }
    j["agents_curve"] = std::move(curve);
  }
  // The JSON is rewritten after every cell, so a run the process cannot finish (the device
  // aborting, a wall-clock limit) still leaves every finished cell behind ("complete": false).
  auto save_json = [&]() -> Status {
    if (f.json_file.empty()) return Status::Ok();
    return write_file(f.json_file, j.dump(1) + "\n", "--json");
  };
  if (auto s = save_json(); !s.ok()) return report(s.error());

  std::vector<TraceCell> cells;
  const Error* first_error = nullptr;
  Error error_store;
  Progress progress(static_cast<int>(traces.size() * modes->size()));
  for (const Trace& t : traces) {
    for (ShareMode m : *modes) {
      auto r = run_trace_cell_repeated(**model, names, ptrs, t, m, opts, f.no_warmup ? 0 : f.warmup_runs, f.runs);
      TraceCell c;
      if (r.ok()) {
        c = std::move(*r);
      } else {
        // A failure that is not running out of memory: record it, finish the table, exit non-zero.
        c.length = t.target_tokens;
        c.mode = m;
        c.status = "error";
        c.message = r.error().message;
        if (!first_error) {
          error_store = r.error();
          first_error = &error_store;
        }
      }
      progress.cell_done(c);
      j["cells"].push_back(cell_to_json(c));
      cells.push_back(std::move(c));
      if (auto s = save_json(); !s.ok()) return report(s.error());
    }
  }
  j["complete"] = true;
  if (auto s = save_json(); !s.ok()) return report(s.error());

  const std::string table = trace_markdown_table(cells, *modes, *lengths);
  fmt::print("{}", table);
  if (!f.markdown_file.empty()) {
    const std::string md = fmt::format(
        "# lragent bench trace: {}\n\n{} on {}; adapters {} r={} on q_proj, v_proj; trajectory {}; KV budget {}.\n"
        "TTFT s = summed over the trace's {} agent calls; tok/s = final trajectory tokens / wall time; KV GB = "
        "peak cache bytes / 1e9 over the trace.\n\n{}",
        preset->name, preset->description, backend.name(), f.adapters, f.rank, source.id,
        f.kv_budget_gb > 0 ? fmt::format("{} GB", f.kv_budget_gb) : std::string("none"), traces.front().agent_calls(), table);
    if (auto s = write_file(f.markdown_file, md, "--markdown"); !s.ok()) return report(s.error());
  }
  return first_error ? report(*first_error) : 0;
}

}  // namespace

void register_bench(CLI::App& app, std::function<int()>& action) {
  static BenchFlags flags;
  BenchFlags* f = &flags;
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (see docs/bench.md)");
  bench->require_subcommand(1);
  CLI::App* cmd = bench->add_subcommand(
      "trace",
      "Multi-agent ReAct traces of the LRAgent poster's lengths (plan / action / observation / reflect, observations "
      "scaled) on a synthetic model with real shapes, under each KV sharing mode: summed TTFT, throughput, decode "
      "tokens/s, cache bytes, peak device memory");
  cmd->add_option("--preset", f->preset, "Model shapes: tiny (CPU tests), llama3.1-8b, ministral-8b, qwen3-8b (random weights made on the device)")
      ->default_val("tiny");
  cmd->add_option("--modes", f->modes, "Comma-separated sharing modes")->default_val(f->modes);
  cmd->add_option("--lengths", f->lengths, "Comma-separated final trajectory lengths in tokens (e.g. 1900,3.0k)")
      ->default_val(kPosterLengths);
  cmd->add_option("--adapters", f->adapters, "shared (one lora_A for the three agents) or indep (base-lr then reports n/a)")
      ->default_val("shared");
  cmd->add_option("--rank", f->rank, "LoRA rank of the three role adapters (q_proj, v_proj)")->default_val(16)->check(cli::positive());
  cmd->add_option("--kv-budget", f->kv_budget_gb,
                  "GB (1e9 bytes) the KV pools of one trace may reserve. When they are full, the least recently run "
                  "other agent's private cache is dropped and recomputed at its next call (see --no-kv-evict); a "
                  "trace that still does not fit is reported as OOM")
      ->check(cli::memory_gb());
  cmd->add_flag("--no-kv-evict", f->no_kv_evict,
                "Under --kv-budget: report OOM when the KV memory is full instead of dropping other agents' private "
                "caches (to be recomputed)");
  cmd->add_option("--json", f->json_file, "Write every cell (and the agents curve) as JSON to FILE");
  cmd->add_option("--markdown", f->markdown_file, "Write the table as markdown to FILE");
  auto* dump_traces = cmd->add_option("--dump-traces", f->dump_traces, "Write the traces (token ids and steps) as JSON to FILE (input of bench/trace/hf_peer.py)");
  cmd->add_flag("--dump-only", f->dump_only, "With --dump-traces: write the traces and stop (no model is built)")
      ->needs(dump_traces);
  cmd->add_flag("--agents-curve", f->agents_curve, "Add cache bytes for 1..--max-agents agents per mode to the JSON");
  cmd->add_option("--curve-length", f->curve_length, "Trajectory length of the agents curve (0, the default: the longest --lengths)")
      ->check(cli::non_negative());
  cmd->add_option("--max-agents", f->max_agents, "Largest agent count of the agents curve")->default_val(16)->check(CLI::Range(1, 256));
  cmd->add_option("--trajectories", f->trajectories, "Trajectory file (default: bench/trace/trajectories.json)");
  cmd->add_option("--trajectory", f->trajectory, "Which trajectory of the file to scale (0: the default)")
      ->default_val(0)
      ->check(cli::non_negative());
  cmd->add_option("--page-size", f->page_size, "Tokens per KV cache page")->default_val(16)->check(cli::positive());
  cmd->add_option("--droidspeak-layers", f->droidspeak_layers, "Layers droidspeak recomputes per agent (its catch-up runs layers 0 to the highest of them)")->default_val("0");
  cmd->add_option("--warmup-runs", f->warmup_runs,
                  "Untimed runs of each cell (length, mode) before it is timed: one-off costs of a new shape "
                  "(GEMM plan lookups, CUDA graph capture) would otherwise land on whichever mode meets it first")
      ->default_val(1)
      ->check(cli::in_range(0, 100));
  cmd->add_option("--runs", f->runs, "Timed runs of each cell; the run of median wall time is reported, with every "
                                     "run's wall time in the JSON")
      ->default_val(1)
      ->check(cli::in_range(1, 100));
  cmd->add_flag("--no-warmup", f->no_warmup, "Skip every untimed warm-up run (the first passes and --warmup-runs)");
  cmd->add_option("--device", f->device, "cpu, or cuda / cuda:N")->default_val("cpu");
  cmd->add_option("--dtype", f->dtype, "With --device cuda: bf16 or f32 weights and caches")->default_val("bf16")->check(CLI::IsMember({"bf16", "f32"}));
  cmd->add_flag("--enforce-eager", f->enforce_eager, "With --device cuda: no CUDA graphs for decode steps");
  add_decode_lookahead_flag(cmd, f->no_decode_lookahead);
  add_prefill_attention_flag(cmd, f->prefill_attention);
  add_threads_flag(cmd, f->threads);
  cmd->callback([f, &action] { action = [f] { return run_bench_trace(*f); }; });
}

}  // namespace lragent::cli
