// Runs cached across test cases, keyed by everything that decides them: the
// spec text and the full list of --set overrides, in order (a later --set
// wins, so order matters). A run is named after its run directory, which
// holds one run: asking for a name again with other inputs throws (a test
// bug; the case fails with the message) instead of handing back the stale
// run. Used by parity.h.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::testing {

template <class Result>
class RunCache {
 public:
  // Spec text and overrides, each length-prefixed so no two lists join alike.
  static std::string key(const std::string& spec_text, const std::vector<std::string>& sets) {
    std::string k = std::to_string(spec_text.size()) + ":" + spec_text;
    for (const auto& s : sets) k += "\n" + std::to_string(s.size()) + ":" + s;
    return k;
  }

  // The run `name` with these inputs: launch() once, then from the cache.
  template <class Launch>
  const Result& get(const std::string& name, const std::string& spec_text,
                    const std::vector<std::string>& sets, Launch&& launch) {
    const std::string k = key(spec_text, sets);
    auto it = runs_.find(name);
    if (it == runs_.end()) return runs_.emplace(name, Entry{k, launch()}).first->second.result;
    if (it->second.key != k)
      throw std::logic_error("run '" + name + "' asked for again with other inputs (its run directory " +
                             "holds the first):\n  before: " + printable(it->second.key) +
                             "\n  now:    " + printable(k) + "\n  give the new run its own name");
    return it->second.result;
  }

  size_t size() const { return runs_.size(); }

 private:
  static std::string printable(std::string k) {
    for (char& c : k)
      if (c == '\n') c = ' ';
    return k.size() > 400 ? "..." + k.substr(k.size() - 400) : k;
  }

  struct Entry {
    std::string key;
    Result result;
  };
  std::map<std::string, Entry> runs_;  // by name
};

}  // namespace dtrain::testing
