// Unit tests of plan/combinations.h and the size limit (plan/model_size.h):
// every rule fires alone on a spec that breaks only it, naming its fields
// and values; a spec the engine runs has none; a custom entrypoint is held
// only to the size limit.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "common/job_spec.h"
#include "plan/combinations.h"
#include "plan/model_size.h"

namespace {

dtrain::JobSpec spec_with(const std::vector<std::string>& sets) { return dtrain::parse_job_spec("", "s.yaml", sets); }

std::string refusal(const dtrain::JobSpec& spec) {
  try {
    dtrain::plan::check_combinations(spec);
  } catch (const dtrain::Error& e) {
    CHECK(e.exit_code() == 2);
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("combinations: each rule fires alone, naming its fields") {
  struct Case {
    const char* name;
    std::vector<std::string> sets;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"zero 3 with pp", {"cluster.procs_per_node=4", "parallel.dp=2", "parallel.pp=2", "parallel.zero=3"},
       "parallel.zero = 3 with parallel.pp = 2 is not implemented yet"},
      {"moe tokens over tp",
       {"cluster.procs_per_node=2", "parallel.tp=2", "model.moe.experts=4", "train.micro_batch=1", "model.seq_len=33"},
       "train.micro_batch * model.seq_len = 33 tokens do not split over parallel.tp = 2"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const dtrain::JobSpec s = spec_with(c.sets);
    const std::vector<std::string> problems = dtrain::plan::combination_problems(s);
    REQUIRE(problems.size() == 1);
    CHECK(has(problems[0], c.expect));
    const std::string e = refusal(s);
    CHECK(has(e, "s.yaml: this spec asks for what the builtin engine cannot run:"));
    CHECK(has(e, c.expect));
    // A custom entrypoint runs what it can: only the size limit holds it.
    dtrain::JobSpec custom = s;
    custom.entrypoint = {"python3", "train.py"};
    REQUIRE_FALSE(custom.builtin_entrypoint());
    CHECK(refusal(custom).empty());
  }
  // Two rules at once: both reported.
  CHECK(dtrain::plan::combination_problems(spec_with({"cluster.procs_per_node=8", "parallel.dp=2", "parallel.pp=2",
                                                      "parallel.zero=3", "model.moe.experts=4", "parallel.tp=2",
                                                      "train.micro_batch=1", "model.seq_len=33"}))
            .size() == 2);
}

TEST_CASE("combinations: what the engine runs passes") {
  for (const std::vector<std::string>& sets : std::vector<std::vector<std::string>>{
           {},
           {"cluster.procs_per_node=8", "parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "parallel.zero=2"},
           {"cluster.procs_per_node=4", "parallel.dp=2", "parallel.tp=2", "parallel.ep=2", "model.moe.experts=4"},
           // MoE in pipeline stages, and under sequence parallelism.
           {"cluster.procs_per_node=4", "parallel.dp=2", "parallel.pp=2", "parallel.ep=2", "model.moe.experts=4"},
           {"cluster.procs_per_node=2", "parallel.tp=2", "parallel.sequence_parallel=true", "model.moe.experts=4"},
           {"cluster.procs_per_node=2", "parallel.dp=2", "parallel.zero=3", "train.precision=bf16"}}) {
    const dtrain::JobSpec s = spec_with(sets);
    CHECK(dtrain::plan::combination_problems(s).empty());
    CHECK(refusal(s).empty());
  }
}

TEST_CASE("model size limit: over 1e12 parameters is refused for every entrypoint") {
  dtrain::JobSpec big = spec_with({"model.d_model=4096", "model.layers=100000"});  // ~2e13 parameters
  CHECK(dtrain::plan::model_size(big).params > dtrain::plan::kMaxParams);
  std::string e = refusal(big);
  CHECK(has(e, "s.yaml: model.d_model = 4096, model.layers = 100000, model.vocab = 256: 2.01e+13 parameters"));
  CHECK(has(e, "more than the maximum 1e12"));
  big.entrypoint = {"python3", "train.py"};
  CHECK(has(refusal(big), "more than the maximum 1e12"));
  CHECK(dtrain::plan::model_size_problems(spec_with({"model.d_model=4096", "model.layers=4"})).empty());
}
