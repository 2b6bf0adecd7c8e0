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
