// The tuning table: tuned configs and their timings, persisted as one JSON file beside the
// kernel cache (<cache dir>/tuning.json), written atomically with mode 0600 through
// util/PrivateFiles (the cache's trust rules, docs/caching.md). docs/tuning.md shows the format.
//
// A file that is missing is empty. A file that cannot be trusted (symlink, foreign owner, loose
// mode), does not parse, has another format version or was written by another flexjit version,
// or holds a record whose key does not match its fields, is ignored with one warning: its
// workloads are retuned (search) or run on the defaults (cached), and the next store replaces
// the file. A stored config is never trusted blindly either: the tuner re-resolves and validates
// it against the variant before use.
#pragma once

#include "kernels/KernelDesc.h"
#include "tune/TuningKey.h"

#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace flexjit::tune {

constexpr int kTuningFormatVersion = 1;

struct CandidateTiming {
  kernels::Params config;
  double median_ms = -1;  // -1: not timed
  std::string status;     // "ok", "compile failed: ...", "launch failed: ...", "wrong output: ..."
};

struct TuningRecord {
  TuningKey key;
  kernels::Params config;  // the winner
  double time_ms = 0;
  kernels::Params default_config;
  double default_ms = 0;
  std::vector<CandidateTiming> candidates;  // timed or failed, in candidate order
  std::vector<std::pair<kernels::Params, std::string>> pruned;  // with the reason
  std::string tuned_at;                                         // UTC, ISO 8601
};

nlohmann::json record_to_json(const TuningRecord& r);
// UnsupportedError naming the field when `j` is not a well-formed record or its "key" does not
// match its fields.
TuningRecord record_from_json(const nlohmann::json& j);

// The whole file: {"format": "flexjit-tuning", "version": 1, "flexjit": "<version>",
// "records": [...]}. parse_tuning_file throws UnsupportedError saying why a text is refused.
std::string tuning_file_text(const std::vector<TuningRecord>& records);
std::vector<TuningRecord> parse_tuning_file(const std::string& text);

class TuningStore {
 public:
  static constexpr const char* kFileName = "tuning.json";
  static constexpr uint64_t kMaxFileBytes = 64ull << 20;

  // A table kept in `file` (empty path: in memory only, nothing persisted).
  explicit TuningStore(std::filesystem::path file);

  // The process-wide store of a kernel cache directory (empty: the in-memory one), shared by
  // every Context that uses that directory.
  static TuningStore& for_cache_dir(const std::filesystem::path& cache_dir);

  std::optional<TuningRecord> find(const TuningKey& key);
  // Adds or replaces the record of r.key: re-reads the file (records other processes stored
  // meanwhile are kept), then writes it atomically. A write that fails is one warning; the
  // record stays in memory for this process.
  void put(const TuningRecord& r);
  std::vector<TuningRecord> records();

  const std::filesystem::path& file() const { return file_; }
  // Why the file on disk was ignored at the last read (empty: it was used, or is missing).
  std::string problem();

 private:
  void load_locked();  // reads file_ into records_ (once, or again before a write)

  std::filesystem::path file_;
  std::mutex mu_;
  bool loaded_ = false;
  std::string problem_;
  std::vector<TuningRecord> records_;
};

}  // namespace flexjit::tune
