// Internals of the job spec shared by spec_*.cpp: the field table (one row per
// YAML key, bound to its JobSpec member), where a field came from (file:line:col
// or the --set that changed it), and the list of problems found so far.
// Not part of the public API: include common/job_spec.h instead.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "common/job_spec.h"

namespace dtrain::detail {

// cluster.nodes: "2" or elastic "1:4".
struct NodesRef {
  int* min;
  int* max;
};

// parallel.dp, train.grad_accum: an integer or `auto` (derived; see spec_resolve.h).
struct AutoIntRef {
  int* value;
  bool* is_auto;
};

// An enum member (common/spec_enums.h), read and written by its names.
struct EnumRef {
  void* member;
  const std::vector<std::string>* names;
  int (*get)(const void* member);
  void (*set)(void* member, int index);
};

// What a field binds to; the alternative decides how its YAML value is read.
using FieldRef = std::variant<int*, uint64_t*, double*, bool*, std::string*, NodesRef,
                              std::vector<std::string>*, std::vector<int>*, AutoIntRef, EnumRef,
                              std::vector<DataSource>*>;

template <typename T>
FieldRef field_ref(T* member) {
  if constexpr (std::is_enum_v<T>)
    return EnumRef{member, &enum_names<T>(),
                   [](const void* m) { return static_cast<int>(*static_cast<const T*>(m)); },
                   [](void* m, int i) { *static_cast<T*>(m) = static_cast<T>(i); }};
  else
    return member;
}

struct Field {
  const char* path;  // "parallel.tp"
  FieldRef (*bind)(JobSpec&);
};

// Every field of the spec in print order (the one list parse, print and
// did-you-mean use, so they cannot disagree). A new row also needs a
// non-default example in tests/unit/common/spec_fields_test.cpp.
const std::vector<Field>& spec_fields();
// Section paths ("cluster", "cluster.rendezvous", ...).
const std::set<std::string>& spec_sections();
bool is_spec_field(const std::string& path);

// Where fields came from, for messages.
struct SpecOrigin {
  std::string source;                             // file name ("" = built in)
  YAML::Node root;                                // the tree after overrides
  std::map<std::string, std::string> overridden;  // path -> "--set path=value"
  std::set<std::string> bad_fields;               // failed to convert: skip checks on them
  // Enum fields whose text is none of their names: path -> the text (the field
  // keeps its default and is in bad_fields; the validator reports it in its turn).
  std::map<std::string, std::string> unknown_names;

  // "file:12:7" (1-based), "--set parallel.tp=3", or the file name alone.
  std::string where(const std::string& path) const;
  // where() of the first overridden path, else the first present one.
  std::string where_any(const std::vector<std::string>& paths) const;
  bool any_bad(const std::vector<std::string>& paths) const;
};

struct Problems {
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  void error(const std::string& where, const std::string& text) {
    errors.push_back(where + ": " + text);
  }
  void warn(const std::string& text) { warnings.push_back(text); }
};

// spec_parse.cpp
YAML::Node parse_yaml_text(const std::string& text, const std::string& source);
void apply_overrides(const std::vector<std::string>& overrides, SpecOrigin& origin,
                     Problems& problems);
void check_keys(const SpecOrigin& origin, Problems& problems);
void convert_fields(SpecOrigin& origin, JobSpec& spec, Problems& problems);

// spec_print.cpp: a field's value as YAML text ("2", "1:4", "[python3, train.py]").
std::string field_text(const FieldRef& ref);

// spec_resolve.cpp: parallel.dp and train.grad_accum `auto` settled from the
// spec's cluster (before validate_spec, which checks the results).
void resolve_auto_fields(SpecOrigin& origin, JobSpec& spec, Problems& problems);

// spec_validate.cpp
void validate_spec(const JobSpec& spec, const SpecOrigin& origin, Problems& problems);
// "PATH = TEXT: must be A, B or C" (and did-you-mean) when the enum field at
// `path` held an unknown name; nothing otherwise.
void check_enum_name(const SpecOrigin& origin, Problems& problems, const std::string& path);
// spec_moe.cpp: model.moe's rules (called by validate_spec).
void validate_moe(const JobSpec& spec, const SpecOrigin& origin, Problems& problems);
// spec_llama.cpp: model.kind llama's fields (called by validate_spec).
void validate_llama(const JobSpec& spec, const SpecOrigin& origin, Problems& problems);
// spec_cp.cpp: parallel.order and parallel.cp's rules (called by validate_spec).
void validate_cp(const JobSpec& spec, const SpecOrigin& origin, Problems& problems);
// spec_trace.cpp: log.trace.steps, a range inside [1, train.steps].
void validate_trace(const JobSpec& spec, const SpecOrigin& origin, Problems& problems);
// train.offload: targets, path given, params with ZeRO-3 (spec_offload.cpp).
void validate_offload(const JobSpec& spec, const SpecOrigin& origin, Problems& problems);
// data.valid (spec_valid.cpp).
void validate_valid(const JobSpec& spec, const SpecOrigin& origin, Problems& problems);
// job.name: length, UTF-8, no control characters (spec_job_name.cpp).
void validate_job_name(const JobSpec& spec, const SpecOrigin& origin, Problems& problems);

// Helpers.
size_t edit_distance(const std::string& a, const std::string& b);
// " (did you mean PREFIX.X?)" for the closest candidate X, or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates,
                         const std::string& prefix = "");
std::string format_double(double v);  // shortest text that reads back exactly
std::string join_choices(const std::vector<int>& values, const std::string& last_sep = " or ");

}  // namespace dtrain::detail
