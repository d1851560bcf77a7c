// YAML values -> JobSpec members, one field-table row at a time. A value of the
// wrong type is reported (field, value, the type expected) and the field keeps
// its default and is marked bad so later rules do not report it twice.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>

#include "common/spec_detail.h"

namespace dtrain::detail {
namespace {

// The node at `path`, or an undefined node when any part is missing.
YAML::Node find_node(const YAML::Node& root, const std::string& path) {
  YAML::Node cur = root;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (!cur || !cur.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& c = cur;
    YAML::Node next = c[part];
    if (!next) return YAML::Node(YAML::NodeType::Undefined);
    cur.reset(next);  // rebind; operator= would overwrite the parent
  }
  return cur;
}

std::string shown(const YAML::Node& n) {
  if (n.IsNull()) return "nothing";
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  return "'" + n.Scalar() + "'";
}

bool parse_int64(const std::string& s, long long& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  out = std::strtoll(s.c_str(), &end, 10);
  return errno == 0 && end && *end == '\0';
}

// Reads one node into one member; returns "" or what was expected.
struct Reader {
  const YAML::Node& node;
  std::optional<std::string>* unknown_name;  // set to an enum field's text that is none of its names

  std::string operator()(int* out) const {
    long long v = 0;
    if (!node.IsScalar() || !parse_int64(node.Scalar(), v)) return "an integer";
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      return "an integer that fits in 32 bits";
    *out = static_cast<int>(v);
    return "";
  }
  std::string operator()(uint64_t* out) const {
    const std::string& s = node.IsScalar() ? node.Scalar() : std::string();
    if (s.empty() || s[0] == '-') return "a non-negative integer";
    errno = 0;
    char* end = nullptr;
    unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (errno != 0 || !end || *end != '\0') return "a non-negative integer";
    *out = v;
    return "";
  }
  std::string operator()(double* out) const {
    const std::string& s = node.IsScalar() ? node.Scalar() : std::string();
    if (s.empty()) return "a number";
    errno = 0;
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (errno != 0 || !end || *end != '\0' || !std::isfinite(v)) return "a number";
    *out = v;
    return "";
  }
  std::string operator()(bool* out) const {
    std::string s = node.IsScalar() ? node.Scalar() : std::string();
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == "true" || s == "yes" || s == "on") *out = true;
    else if (s == "false" || s == "no" || s == "off") *out = false;
    else return "true or false";
    return "";
  }
  std::string operator()(std::string* out) const {
    if (node.IsNull()) {
      out->clear();
      return "";
    }
    if (!node.IsScalar()) return "a string";
    *out = node.Scalar();
    return "";
  }
  std::string operator()(NodesRef ref) const {
    const char* expected = "a node count like 2, or an elastic range like \"1:4\"";
    if (!node.IsScalar()) return expected;
    const std::string& s = node.Scalar();
    size_t colon = s.find(':');
    long long lo = 0, hi = 0;
    bool ok = colon == std::string::npos
                  ? parse_int64(s, lo) && (hi = lo, true)
                  : parse_int64(s.substr(0, colon), lo) && parse_int64(s.substr(colon + 1), hi);
    if (!ok || lo < std::numeric_limits<int>::min() || hi > std::numeric_limits<int>::max())
      return expected;
    *ref.min = static_cast<int>(lo);
    *ref.max = static_cast<int>(hi);
    return "";
  }
  std::string operator()(AutoIntRef ref) const {
    if (node.IsScalar() && node.Scalar() == "auto") {
      *ref.is_auto = true;
      return "";
    }
    std::string expected = (*this)(ref.value);
    if (expected.empty()) *ref.is_auto = false;
    return expected;
  }
  std::string operator()(std::vector<std::string>* out) const {
    const char* expected = "builtin, a command string, or a list of strings";
    if (node.IsScalar()) {
      // A command string is split on whitespace (no shell quoting).
      std::vector<std::string> words;
      std::istringstream ss(node.Scalar());
      for (std::string w; ss >> w;) words.push_back(w);
      *out = words;
      return "";
    }
    if (!node.IsSequence()) return expected;
    std::vector<std::string> words;
    for (const auto& item : node) {
      if (!item.IsScalar()) return expected;
      words.push_back(item.Scalar());
    }
    *out = words;
    return "";
  }
  std::string operator()(EnumRef ref) const {
    if (!node.IsNull() && !node.IsScalar()) return "a string";
    std::string text = node.IsNull() ? std::string() : node.Scalar();
    for (size_t i = 0; i < ref.names->size(); ++i)
      if ((*ref.names)[i] == text) {
        ref.set(ref.member, static_cast<int>(i));
        return "";
      }
    *unknown_name = text;
    return "";
  }
  std::string operator()(std::vector<int>* out) const {
    const char* expected = "a list of integers like [2, 2]";
    if (node.IsNull()) {
      out->clear();
      return "";
    }
    if (!node.IsSequence()) return expected;
    std::vector<int> values;
    for (const auto& item : node) {
      long long v = 0;
      if (!item.IsScalar() || !parse_int64(item.Scalar(), v) || v < std::numeric_limits<int>::min() ||
          v > std::numeric_limits<int>::max())
        return expected;
      values.push_back(static_cast<int>(v));
    }
    *out = values;
    return "";
  }
  // data.blend: [{path: PREFIX, weight: W}, ...] (null or [] = no blend).
  std::string operator()(std::vector<DataSource>* out) const {
    const char* expected = "a list like [{path: PREFIX_A, weight: 0.7}, {path: PREFIX_B, weight: 0.3}]";
    if (node.IsNull()) {
      out->clear();
      return "";
    }
    if (!node.IsSequence()) return expected;
    std::vector<DataSource> sources;
    for (const auto& item : node) {
      if (!item.IsMap() || item.size() != 2 || !item["path"] || !item["weight"]) return expected;
      DataSource s;
      if (!(*this).with(item["path"])(&s.path).empty() || !(*this).with(item["weight"])(&s.weight).empty())
        return expected;
      sources.push_back(s);
    }
    *out = sources;
    return "";
  }
  Reader with(const YAML::Node& n) const { return Reader{n, unknown_name}; }
};

}  // namespace

void convert_fields(SpecOrigin& origin, JobSpec& spec, Problems& problems) {
  for (const auto& field : spec_fields()) {
    YAML::Node node = find_node(origin.root, field.path);
    if (!node) continue;  // missing: keep the default
    std::optional<std::string> unknown_name;
    std::string expected = std::visit(Reader{node, &unknown_name}, field.bind(spec));
    if (unknown_name) {
      origin.unknown_names[field.path] = *unknown_name;
      origin.bad_fields.insert(field.path);
    }
    if (expected.empty()) continue;
    origin.bad_fields.insert(field.path);
    std::string path = field.path;
    std::string leaf = path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.') + 1);
    JobSpec defaults;
    problems.error(origin.where(path), path + ": expected " + expected + ", got " + shown(node) +
                                           "; write it like " + leaf + ": " +
                                           field_text(field.bind(defaults)) + " (the default)" +
                                           (std::holds_alternative<AutoIntRef>(field.bind(defaults))
                                                ? ", or " + leaf + ": auto"
                                                : ""));
  }
}

}  // namespace dtrain::detail
