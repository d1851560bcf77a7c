// Reading a job spec: YAML text -> tree, --set overrides applied to the tree,
// unknown keys found, and every field converted into JobSpec with type errors
// collected (not thrown). Rules between fields live in spec_validate.cpp.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "common/error.h"
#include "common/spec_detail.h"

namespace dtrain::detail {

YAML::Node parse_yaml_text(const std::string& text, const std::string& source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    std::string file = source.empty() ? "<spec>" : source;
    throw Error(ErrorCode::config,
                file + ":" + std::to_string(e.mark.line + 1) + ":" +
                    std::to_string(e.mark.column + 1) + ": malformed YAML: " + e.msg,
                "fix the YAML syntax at that line and column");
  }
}

namespace {

std::vector<std::string> all_field_paths() {
  std::vector<std::string> out;
  for (const auto& f : spec_fields()) out.push_back(f.path);
  return out;
}

// Known keys directly under `prefix` ("" = top level).
std::vector<std::string> child_keys(const std::string& prefix) {
  std::vector<std::string> out;
  auto add = [&](const std::string& path) {
    if (!prefix.empty() && path.compare(0, prefix.size() + 1, prefix + ".") != 0) return;
    std::string rest = prefix.empty() ? path : path.substr(prefix.size() + 1);
    if (rest.find('.') == std::string::npos) out.push_back(rest);
  };
  for (const auto& f : spec_fields()) add(f.path);
  for (const auto& s : spec_sections()) add(s);
  return out;
}

std::string describe(const YAML::Node& n) {
  if (!n || n.IsNull()) return "nothing";
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  return "'" + n.Scalar() + "'";
}

bool split_override(const std::string& text, std::string& key, std::string& value) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  key = text.substr(0, eq);
  value = text.substr(eq + 1);
  while (!key.empty() && key.back() == ' ') key.pop_back();
  if (key.empty() || key.front() == '.' || key.back() == '.') return false;
  return key.find("..") == std::string::npos;
}

// Sets root[a][b]...[z] = value, creating sections; "" or an error text.
std::string set_path(YAML::Node& root, const std::string& key, const YAML::Node& value) {
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) return "the spec is " + describe(root) + ", not a mapping";
  YAML::Node cur = root;
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += (i ? "." : "") + parts[i];
    if (is_spec_field(walked)) return walked + " is a value, not a section";
    YAML::Node next = cur[parts[i]];
    if (!next || next.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next.reset(cur[parts[i]]);
    } else if (!next.IsMap()) {
      return walked + " is " + describe(next) + ", not a section";
    }
    cur.reset(next);  // rebind; operator= would overwrite the parent
  }
  cur[parts.back()] = value;
  return "";
}

}  // namespace

void apply_overrides(const std::vector<std::string>& overrides, SpecOrigin& origin,
                     Problems& problems) {
  for (const auto& text : overrides) {
    std::string where = "--set " + text, key, value;
    if (!split_override(text, key, value)) {
      problems.error(where, "expected key.path=value, e.g. --set parallel.tp=2");
      continue;
    }
    YAML::Node parsed;
    try {
      parsed = YAML::Load(value);
    } catch (const YAML::ParserException& e) {
      problems.error(where, key + " = " + value + ": the value is not valid YAML (" + e.msg +
                                "); quote it, e.g. --set '" + key + "=\"" + value + "\"'");
      continue;
    }
    std::string err = set_path(origin.root, key, parsed);
    if (!err.empty()) {
      problems.error(where, "cannot set " + key + ": " + err);
      continue;
    }
    origin.overridden[key] = where;
  }
}

namespace {

void check_map_keys(const YAML::Node& map, const std::string& prefix, const SpecOrigin& origin,
                    Problems& problems);

void check_key(const std::string& key, const YAML::Node& value, const YAML::Mark& key_mark,
               const std::string& prefix, const SpecOrigin& origin, Problems& problems) {
  std::string path = prefix.empty() ? key : prefix + "." + key;
  std::string where = origin.overridden.count(path) ? origin.where(path) : origin.where(prefix);
  if (!origin.overridden.count(path) && !key_mark.is_null() && key_mark.line >= 0)
    where = (origin.source.empty() ? "<spec>" : origin.source) + ":" +
            std::to_string(key_mark.line + 1) + ":" + std::to_string(key_mark.column + 1);
  if (key == "token") {
    problems.error(where, path + ": tokens never go in the YAML (specs are shared and logged); "
                                 "set the DTRAIN_TOKEN environment variable or "
                                 "cluster.rendezvous.token_file");
    return;
  }
  if (is_spec_field(path)) return;  // converted (and type-checked) later
  if (spec_sections().count(path)) {
    if (value.IsMap())
      check_map_keys(value, path, origin, problems);
    else if (!value.IsNull())
      problems.error(where, path + ": expected a section (mapping), got " + describe(value) +
                                "; write it as " + path + ": {key: value, ...}");
    return;
  }
  std::string hint = did_you_mean(key, child_keys(prefix), prefix);
  if (hint.empty()) {
    // Maybe the key belongs to another section ("train.seq_len" -> model.seq_len).
    std::vector<std::string> same_leaf;
    for (const auto& f : all_field_paths()) {
      std::string leaf = f.substr(f.rfind('.') == std::string::npos ? 0 : f.rfind('.') + 1);
      if (leaf == key) same_leaf.push_back(f);
    }
    if (!same_leaf.empty()) hint = " (did you mean " + same_leaf.front() + "?)";
  }
  if (hint.empty() && prefix.empty()) hint = "; sections: job, cluster, parallel, model, "
                                             "train, data, checkpoint, log, entrypoint";
  problems.error(where, "unknown key '" + path + "'" + hint);
}

void check_map_keys(const YAML::Node& map, const std::string& prefix, const SpecOrigin& origin,
                    Problems& problems) {
  std::set<std::string> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it->first.IsScalar()) {
      problems.error(origin.where(prefix), "a key must be a plain name, got " +
                                               describe(it->first));
      continue;
    }
    std::string key = it->first.Scalar();
    if (!seen.insert(key).second) {
      std::string path = prefix.empty() ? key : prefix + "." + key;
      problems.error(origin.where(path), path + " appears twice; keep one");
      continue;
    }
    check_key(key, it->second, it->first.Mark(), prefix, origin, problems);
  }
}

}  // namespace

void check_keys(const SpecOrigin& origin, Problems& problems) {
  if (!origin.root || origin.root.IsNull()) return;
  if (!origin.root.IsMap()) {
    problems.error(origin.where(""), "the spec must be a mapping of sections (job:, cluster:, "
                                     "parallel:, ...), got " + describe(origin.root));
    return;
  }
  check_map_keys(origin.root, "", origin, problems);
}

}  // namespace dtrain::detail
