// The job spec's mesh-order and context-parallelism fields: parallel.order
// names every axis once; parallel.cp splits model.seq_len into 2 x cp chunks
// (two per rank, load-balanced for the causal mask). Which features cp runs
// with is the cost model's rule (plan/combinations.cpp). Problems are
// collected like the rest of validate_spec; nothing throws.
#include <string>

#include "common/spec_detail.h"

namespace dtrain::detail {

void validate_cp(const JobSpec& s, const SpecOrigin& origin, Problems& problems) {
  const ParallelSpec& p = s.parallel;
  auto bad = [&](std::initializer_list<std::string> paths) { return origin.any_bad(paths); };
  auto error = [&](const std::string& path, const std::string& text) { problems.error(origin.where(path), text); };
  mesh::Order order{};
  std::string why;
  if (!bad({"parallel.order"}) && !mesh::parse_order(p.order, &order, &why))
    error("parallel.order", "parallel.order = " + p.order + ": " + why +
                                "; use the four axes innermost first, e.g. tp-cp-dp-pp (the default)");
  if (bad({"parallel.cp"})) return;
  if (p.cp < 1) {
    error("parallel.cp", "parallel.cp = " + std::to_string(p.cp) + ": must be >= 1; use 1 to not split the sequence");
    return;
  }
  if (p.cp == 1) return;
  const std::string cp = "parallel.cp = " + std::to_string(p.cp);
  if (!bad({"model.seq_len"}) && s.model.seq_len % (2 * p.cp) != 0)
    error("parallel.cp", cp + " needs model.seq_len = " + std::to_string(s.model.seq_len) +
                             " divisible by 2 x cp = " + std::to_string(2 * p.cp) +
                             " (each rank holds two chunks of seq_len / (2 cp) tokens); use a seq_len that is a "
                             "multiple of " + std::to_string(2 * p.cp) + " or a smaller cp");
}

}  // namespace dtrain::detail
