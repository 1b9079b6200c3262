#include "util/Log.h"

#include "util/Env.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

namespace flexjit::logging {

namespace {
struct Stages {
  std::mutex mutex;
  bool loaded = false;
  bool all = false;
  std::vector<std::string> names;
};

Stages& stages() {
  static Stages s;
  return s;
}

void load_locked(Stages& s) {
  s.names = env::list("FLEXJIT_LOG");
  s.all = std::find(s.names.begin(), s.names.end(), "all") != s.names.end();
  s.loaded = true;
}
}  // namespace

bool enabled(std::string_view stage) {
  Stages& s = stages();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.loaded) load_locked(s);
  return s.all || std::find(s.names.begin(), s.names.end(), stage) != s.names.end();
}

void reload() {
  Stages& s = stages();
  std::lock_guard<std::mutex> lock(s.mutex);
  load_locked(s);
}

void write(std::string_view stage, std::string_view message) {
  // One fputs per line so that lines from several threads do not interleave.
  std::string line = fmt::format("flexjit[{}] {}\n", stage, message);
  std::fputs(line.c_str(), stderr);
}

}  // namespace flexjit::logging
