// Named configurations on the host side, shared by the CUDA backends (no torch, no device code).
//   KBENCH_PRINT_CONFIG=1   each backend prints the configuration it picks for a new shape, once, to stderr
//                           (DeepGEMM's habit), e.g. "mla_attention bs=128 kv_len=4097: MlaConfig{splits=2}".
//   KBENCH_<BACKEND>_<KNOB> tuning knobs the benchmark scripts set to time a candidate beside the default; read on
//                           every call, so a script can switch them between calls. Unset: the shipped default.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

extern char** environ;  // (POSIX; <unistd.h> declares it only under some feature macros)

namespace kb {

// The integer value of environment variable `name`, or `fallback` when it is unset, empty or not a number.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (end && *end == '\0') ? static_cast<int>(x) : fallback;
}

// Whether environment variable `name` is exactly `value` (as Python's os.environ.get(name) == value).
inline bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// The environment's values of `names` as one text ("name=value;", "name;" where unset): a graph's knobs.
inline std::string env_text(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) {
    const char* v = std::getenv(name.c_str());
    text += name;
    if (v) (text += '=') += v;
    text += ';';
  }
  return text;
}

// Whether the environment's variables that start with a prefix changed since the last look: one pass over the
// environment, where each getenv is a pass of its own. The replay paths read ~20 knobs a call through getenv (a
// graph's key holds the configuration they pick), 4-13 us of host time inside the official window, where the host
// runs slowly right after the timer's synchronize (docs/moe-notes.md, forty-seventh session); with this they read
// them again only when one changed (a benchmark switching candidates, a test's monkeypatch).
// PREFIXKNOB_MEMO=0 (candidate `knob-reads`): every look says changed, so the knobs are read every call as before.
class KnobsMemo {
 public:
  explicit KnobsMemo(const char* prefix)
      : prefix_(prefix), length_(std::strlen(prefix)), off_(std::string(prefix) + "KNOB_MEMO=0\n") {}

  // True on the first look and whenever an entry "PREFIX...=value" appeared, went or changed since the last one.
  bool changed() {
    scan_.clear();
    for (char** e = environ; e != nullptr && *e != nullptr; ++e)
      if (std::strncmp(*e, prefix_, length_) == 0) (scan_ += *e) += '\n';
    if (seen_ && scan_ == last_ && scan_.find(off_) == std::string::npos) return false;
    last_.swap(scan_);
    seen_ = true;
    return true;
  }

 private:
  const char* prefix_;
  size_t length_;
  std::string off_;          // the entry that turns the memo off
  std::string scan_, last_;  // (kept: no allocation a call once they are as long as the entries)
  bool seen_ = false;
};

// Whether KBENCH_PRINT_CONFIG asks for configurations to be printed (read once).
inline bool printing_configs() {
  static const bool on = env_int("KBENCH_PRINT_CONFIG", 0) != 0;
  return on;
}

// Prints `line` to stderr the first time it is seen, when KBENCH_PRINT_CONFIG asks for it.
inline void print_config_once(const std::string& line) {
  if (!printing_configs()) return;
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(line).second) fprintf(stderr, "%s\n", line.c_str());
}

// The same for a line that `describe(buf, size)` writes: called only when printing, so a backend's hot path pays
// one branch, not the formatting.
template <class Describe, std::enable_if_t<std::is_invocable_v<Describe&, char*, int>, int> = 0>
inline void print_config_once(Describe&& describe) {
  if (!printing_configs()) return;
  char buf[512];
  describe(buf, static_cast<int>(sizeof(buf)));
  print_config_once(std::string(buf));
}

}  // namespace kb
