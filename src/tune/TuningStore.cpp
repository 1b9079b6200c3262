#include "tune/TuningStore.h"

#include <flexjit/error.h>

#include "util/PrivateFiles.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <memory>

#ifndef FLEXJIT_VERSION
#define FLEXJIT_VERSION "dev"
#endif

namespace flexjit::tune {

namespace {

using nlohmann::json;

json params_json(const kernels::Params& p) {
  json j = json::object();
  for (const auto& [name, value] : p.items())
    j[name] = value;
  return j;
}

kernels::Params params_from(const json& j, const char* what) {
  if (!j.is_object()) throw UnsupportedError(fmt::format("'{}' is not an object", what));
  kernels::Params p;
  for (const auto& [name, value] : j.items()) {
    if (!value.is_number_integer()) {
      throw UnsupportedError(fmt::format("'{}.{}' is not an integer", what, name));
    }
    p.set(name, value.get<int64_t>());
  }
  return p;
}

template <typename T>
T field(const json& j, const char* name) {
  if (!j.contains(name)) throw UnsupportedError(fmt::format("missing '{}'", name));
  try {
    return j.at(name).get<T>();
  } catch (const json::exception&) {
    throw UnsupportedError(fmt::format("'{}' has the wrong type", name));
  }
}

std::string now_utc() {
  return fmt::format("{:%FT%TZ}",
                     std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now()));
}

}  // namespace

json record_to_json(const TuningRecord& r) {
  json cands = json::array();
  for (const CandidateTiming& c : r.candidates) {
    cands.push_back({{"config", params_json(c.config)},
                     {"time_ms", c.median_ms >= 0 ? json(c.median_ms) : json(nullptr)},
                     {"status", c.status}});
  }
  json pruned = json::array();
  for (const auto& [config, reason] : r.pruned)
    pruned.push_back({{"config", params_json(config)}, {"reason", reason}});
  const TuningKey& k = r.key;
  return {{"key", k.str()},
          {"device",
           {{"name", k.device.name},
            {"cc", fmt::format("{}.{}", k.device.cc_major, k.device.cc_minor)},
            {"sm_count", k.device.sm_count}}},
          {"kernel", k.kernel},
          {"mods_hash", k.mods_hash},
          {"dtype", std::string(to_string(k.dtype))},
          {"head_dims", {k.head_dim_qk, k.head_dim_v}},
          {"gqa_ratio", k.gqa_ratio},
          {"bucket", k.bucket},
          {"fixed", k.fixed},
          {"config", params_json(r.config)},
          {"time_ms", r.time_ms},
          {"default_config", params_json(r.default_config)},
          {"default_ms", r.default_ms},
          {"candidates", cands},
          {"pruned", pruned},
          {"tuned_at", r.tuned_at.empty() ? now_utc() : r.tuned_at}};
}

TuningRecord record_from_json(const json& j) {
  if (!j.is_object()) throw UnsupportedError("a record is not an object");
  TuningRecord r;
  TuningKey& k = r.key;
  const json dev = field<json>(j, "device");
  k.device.name = field<std::string>(dev, "name");
  const std::string cc = field<std::string>(dev, "cc");
  if (std::sscanf(cc.c_str(), "%d.%d", &k.device.cc_major, &k.device.cc_minor) != 2) {
    throw UnsupportedError(fmt::format("'device.cc' is '{}', not MAJOR.MINOR", cc));
  }
  k.device.sm_count = field<int>(dev, "sm_count");
  k.kernel = field<std::string>(j, "kernel");
  k.mods_hash = field<std::string>(j, "mods_hash");
  const std::string dtype = field<std::string>(j, "dtype");
  auto dt = parse_dtype(dtype);
  if (!dt) throw UnsupportedError(fmt::format("'dtype' is '{}'", dtype));
  k.dtype = *dt;
  const auto dims = field<std::vector<int>>(j, "head_dims");
  if (dims.size() != 2) throw UnsupportedError("'head_dims' is not [qk, v]");
  k.head_dim_qk = dims[0];
  k.head_dim_v = dims[1];
  k.gqa_ratio = field<int>(j, "gqa_ratio");
  k.bucket = field<std::string>(j, "bucket");
  k.fixed = field<std::string>(j, "fixed");
  if (field<std::string>(j, "key") != k.str()) {
    throw UnsupportedError("its 'key' does not match its fields (edited or corrupted)");
  }
  r.config = params_from(field<json>(j, "config"), "config");
  if (r.config.empty()) throw UnsupportedError("'config' is empty");
  r.time_ms = field<double>(j, "time_ms");
  r.default_config = params_from(field<json>(j, "default_config"), "default_config");
  r.default_ms = field<double>(j, "default_ms");
  for (const json& c : field<json>(j, "candidates")) {
    CandidateTiming t;
    t.config = params_from(field<json>(c, "config"), "candidates[].config");
    t.median_ms =
        c.contains("time_ms") && c.at("time_ms").is_number() ? c.at("time_ms").get<double>() : -1;
    t.status = field<std::string>(c, "status");
    r.candidates.push_back(std::move(t));
  }
  for (const json& p : field<json>(j, "pruned")) {
    r.pruned.emplace_back(params_from(field<json>(p, "config"), "pruned[].config"),
                          field<std::string>(p, "reason"));
  }
  r.tuned_at = field<std::string>(j, "tuned_at");
  return r;
}

std::string tuning_file_text(const std::vector<TuningRecord>& records) {
  json recs = json::array();
  for (const TuningRecord& r : records)
    recs.push_back(record_to_json(r));
  return json{{"format", "flexjit-tuning"},
              {"version", kTuningFormatVersion},
              {"flexjit", FLEXJIT_VERSION},
              {"records", recs}}
             .dump(2) +
         "\n";
}

std::vector<TuningRecord> parse_tuning_file(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number overflow
    throw UnsupportedError(fmt::format("it is not valid JSON ({})", e.what()));
  }
  if (!j.is_object() || !j.contains("format") || j.at("format") != "flexjit-tuning") {
    throw UnsupportedError("it is not a flexjit tuning file (no \"format\": \"flexjit-tuning\")");
  }
  const int version = j.contains("version") && j.at("version").is_number_integer()
                          ? j.at("version").get<int>()
                          : -1;
  if (version != kTuningFormatVersion) {
    throw UnsupportedError(fmt::format("it has format version {}; this flexjit reads {}", version,
                                       kTuningFormatVersion));
  }
  const std::string by = j.contains("flexjit") && j.at("flexjit").is_string()
                             ? j.at("flexjit").get<std::string>()
                             : "";
  if (by != FLEXJIT_VERSION) {
    throw UnsupportedError(
        fmt::format("it was written by flexjit {}; this is {} (kernels may have changed: stale)",
                    by, FLEXJIT_VERSION));
  }
  if (!j.contains("records") || !j.at("records").is_array()) {
    throw UnsupportedError("'records' is not a list");
  }
  std::vector<TuningRecord> out;
  size_t i = 0;
  for (const json& r : j.at("records")) {
    try {
      out.push_back(record_from_json(r));
    } catch (const UnsupportedError& e) {
      throw UnsupportedError(fmt::format("record {}: {}", i, e.what()));
    } catch (const json::exception& e) {
      throw UnsupportedError(fmt::format("record {}: {}", i, e.what()));
    }
    ++i;
  }
  return out;
}

TuningStore::TuningStore(std::filesystem::path file) : file_(std::move(file)) {}

TuningStore& TuningStore::for_cache_dir(const std::filesystem::path& cache_dir) {
  static std::mutex mu;
  static auto* stores = new std::map<std::filesystem::path, std::unique_ptr<TuningStore>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& s = (*stores)[cache_dir];
  if (!s) {
    s = std::make_unique<TuningStore>(cache_dir.empty() ? std::filesystem::path()
                                                        : cache_dir / kFileName);
  }
  return *s;
}

void TuningStore::load_locked() {
  loaded_ = true;
  problem_.clear();
  if (file_.empty()) return;
  files::PrivateFile f = files::open_private_file(file_, kMaxFileBytes);
  if (f.missing) {
    records_.clear();
    return;
  }
  std::string why;
  std::string text;
  if (!f.ok()) {
    why = f.problem;
  } else if (!files::read_exact(f.fd, text, f.size)) {
    why = "it cannot be read";
  } else {
    try {
      records_ = parse_tuning_file(text);
      return;
    } catch (const UnsupportedError& e) {
      why = e.what();
    }
  }
  problem_ = fmt::format(
      "the tuning file {} is ignored: {}; its workloads are retuned (search) or "
      "use the defaults (cached), and the next tuning result replaces it",
      file_.string(), why);
  files::warn_once("tune", problem_);
  // What this process tuned is kept; the file's contents are not trusted.
}

std::optional<TuningRecord> TuningStore::find(const TuningKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loaded_) load_locked();
  for (const TuningRecord& r : records_) {
    if (r.key == key) return r;
  }
  return std::nullopt;
}

void TuningStore::put(const TuningRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  // Re-read so that what other processes stored since is kept (last writer wins per key).
  std::vector<TuningRecord> mine = std::move(records_);
  records_.clear();
  load_locked();
  for (const TuningRecord& m : mine) {
    bool present = false;
    for (const TuningRecord& x : records_)
      present = present || x.key == m.key;
    if (!present) records_.push_back(m);
  }
  TuningRecord rec = r;
  if (rec.tuned_at.empty()) rec.tuned_at = now_utc();
  bool replaced = false;
  for (TuningRecord& x : records_) {
    if (x.key == rec.key) {
      x = rec;
      replaced = true;
    }
  }
  if (!replaced) records_.push_back(rec);
  if (file_.empty()) return;
  try {
    const files::DirCheck dir =
        files::open_private_dir(file_.parent_path(), "kernel cache directory");
    if (dir.state != files::DirState::Writable) {
      throw CacheError(dir.problem.empty() ? "the directory is not writable" : dir.problem);
    }
    files::write_private_file(file_, tuning_file_text(records_));
  } catch (const Error& e) {
    files::warn_once("tune", fmt::format("cannot store tuning results in {}: {}; they are kept "
                                         "for this process only",
                                         file_.string(), e.what()));
  }
}

std::vector<TuningRecord> TuningStore::records() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loaded_) load_locked();
  return records_;
}

std::string TuningStore::problem() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loaded_) load_locked();
  return problem_;
}

}  // namespace flexjit::tune
