// Printing a resolved job spec: YAML and JSON with every field (both load back
// with load_job_spec to the same spec), and the one-line-per-value summary of
// derived values. Driven by the field table, so no field can be forgotten.
#include <nlohmann/json.hpp>

#include <sstream>

#include "common/spec_detail.h"

namespace dtrain {
namespace detail {
namespace {

std::string yaml_scalar(const std::string& s) {
  YAML::Emitter e;
  e << s;
  return e.c_str();
}

std::string nodes_text(const NodesRef& r) {
  if (*r.min == *r.max) return std::to_string(*r.min);
  return std::to_string(*r.min) + ":" + std::to_string(*r.max);
}

struct TextOf {
  std::string operator()(int* v) const { return std::to_string(*v); }
  std::string operator()(uint64_t* v) const { return std::to_string(*v); }
  std::string operator()(double* v) const { return format_double(*v); }
  std::string operator()(bool* v) const { return *v ? "true" : "false"; }
  std::string operator()(std::string* v) const { return yaml_scalar(*v); }
  std::string operator()(NodesRef r) const {
    return *r.min == *r.max ? nodes_text(r) : "\"" + nodes_text(r) + "\"";
  }
  std::string operator()(std::vector<std::string>* v) const {
    if (v->size() == 1 && (*v)[0] == "builtin") return "builtin";
    YAML::Emitter e;
    e << YAML::Flow << YAML::BeginSeq;
    for (const auto& w : *v) e << w;
    e << YAML::EndSeq;
    return e.c_str();
  }
  std::string operator()(AutoIntRef r) const { return *r.is_auto ? "auto" : std::to_string(*r.value); }
  std::string operator()(EnumRef r) const { return yaml_scalar((*r.names)[r.get(r.member)]); }
  std::string operator()(std::vector<int>* v) const {
    std::string out = "[";
    for (size_t i = 0; i < v->size(); ++i) out += (i ? ", " : "") + std::to_string((*v)[i]);
    return out + "]";
  }
  std::string operator()(std::vector<DataSource>* v) const {
    std::string out = "[";
    for (size_t i = 0; i < v->size(); ++i)
      out += std::string(i ? ", " : "") + "{path: " + yaml_scalar((*v)[i].path) + ", weight: " +
             format_double((*v)[i].weight) + "}";
    return out + "]";
  }
};

struct JsonOf {
  using json = nlohmann::ordered_json;
  json operator()(int* v) const { return *v; }
  json operator()(uint64_t* v) const { return *v; }
  json operator()(double* v) const { return *v; }
  json operator()(bool* v) const { return *v; }
  json operator()(std::string* v) const { return *v; }
  json operator()(NodesRef r) const {
    if (*r.min == *r.max) return *r.min;
    return nodes_text(r);
  }
  json operator()(std::vector<std::string>* v) const {
    if (v->size() == 1 && (*v)[0] == "builtin") return "builtin";
    return *v;
  }
  json operator()(std::vector<int>* v) const { return *v; }
  json operator()(AutoIntRef r) const {
    if (*r.is_auto) return "auto";
    return *r.value;
  }
  json operator()(EnumRef r) const { return (*r.names)[r.get(r.member)]; }
  json operator()(std::vector<DataSource>* v) const {
    json out = json::array();
    for (const auto& s : *v) out.push_back(json{{"path", s.path}, {"weight", s.weight}});
    return out;
  }
};

std::vector<std::string> split(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  return parts;
}

}  // namespace

std::string field_text(const FieldRef& ref) { return std::visit(TextOf{}, ref); }

}  // namespace detail

std::string job_spec_to_yaml(const JobSpec& spec) {
  JobSpec copy = spec;  // the table binds to a mutable spec
  std::string out = "# resolved job spec: every field, defaults filled in\n";
  std::vector<std::string> open;  // sections of the previous field
  for (const auto& field : detail::spec_fields()) {
    std::vector<std::string> parts = detail::split(field.path);
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common])
      ++common;
    for (size_t i = common; i + 1 < parts.size(); ++i)
      out += std::string(2 * i, ' ') + parts[i] + ":\n";
    out += std::string(2 * (parts.size() - 1), ' ') + parts.back() + ": " +
           detail::field_text(field.bind(copy)) + "\n";
    open.assign(parts.begin(), parts.end() - 1);
  }
  return out;
}

std::string job_spec_to_json(const JobSpec& spec) {
  JobSpec copy = spec;
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  for (const auto& field : detail::spec_fields()) {
    nlohmann::ordered_json* cur = &root;
    std::vector<std::string> parts = detail::split(field.path);
    for (size_t i = 0; i + 1 < parts.size(); ++i) cur = &(*cur)[parts[i]];
    (*cur)[parts.back()] = std::visit(detail::JsonOf{}, field.bind(copy));
  }
  return root.dump(2);
}

std::string job_spec_summary(const JobSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  const TrainSpec& t = spec.train;
  auto s = [](long long v) { return std::to_string(v); };
  std::string nodes = spec.cluster.nodes_min == spec.cluster.nodes_max
                          ? s(spec.cluster.nodes_max)
                          : s(spec.cluster.nodes_min) + ":" + s(spec.cluster.nodes_max);
  std::string out;
  out += "world = dp(" + s(p.dp) + (p.dp_auto ? ", auto" : "") + ") x tp(" + s(p.tp) + ") x pp(" + s(p.pp) + ")" +
         (p.cp > 1 ? " x cp(" + s(p.cp) + ")" : std::string()) + " = " + s(spec.world()) + " ranks (ep " + s(p.ep) + ", zero " + s(p.zero) + ")\n";
  out += "ranks per node = " + s(spec.ranks_per_node()) + " on " + nodes + " node(s), device " +
         to_string(spec.cluster.device) + "\n";
  out += "GBS = micro_batch(" + s(t.micro_batch) + ") x grad_accum(" + s(t.grad_accum) +
         (t.grad_accum_auto ? ", auto" : "") + ") x dp(" + s(p.dp) + ") = " +
         s(spec.global_batch()) + " sequences" + (t.global_batch > 0 ? " (train.global_batch)" : "") +
         "\n";
  out += "tokens per step = GBS(" + s(spec.global_batch()) + ") x seq_len(" +
         s(spec.model.seq_len) + ") = " + s(spec.tokens_per_step()) + "\n";
  return out;
}

}  // namespace dtrain
