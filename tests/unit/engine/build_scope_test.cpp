// What a rank builds of the model (gpt.h's BuildScope, parallelize.h's
// build_scope): the seeded draws of a cut or skipped parameter equal the
// whole tensor's (param_init.h), and a pp-2 / tp-2 / ep-2 rank holds its
// share only, element for element the 1-process model's numbers, and the
// planner's build figure counts exactly that.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/mesh.h"
#include "engine/model/gpt.h"
#include "engine/model/param_init.h"
#include "engine/parallel/parallelize.h"
#include "engine/parallel/pipeline/pipeline_schedule.h"
#include "engine/parallel/tensor/tensor_parallel.h"
#include "plan/memory_plan.h"

#include "tests/support/torch_doctest.h"

namespace {

using namespace dtrain::engine;

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == 0 ? 0.0 : (a - b).abs().max().item<double>();
}

model::GptConfig config_of(const dtrain::ModelSpec& m) {
  model::GptConfig c;
  c.vocab = m.vocab, c.layers = m.layers, c.d_model = m.d_model, c.heads = m.heads, c.seq_len = m.seq_len;
  c.moe.experts = m.moe.experts, c.moe.top_k = m.moe.top_k, c.moe.every = m.moe.every, c.moe.d_ff = m.moe.d_ff;
  c.kind = m.kind, c.kv_heads = m.kv_heads, c.ffn_hidden = m.ffn_hidden, c.tie_embeddings = m.tie_embeddings;
  return c;
}

}  // namespace

TEST_CASE("normal_range and skip_normal draw what at::normal_ on the whole tensor draws, and leave the stream there") {
  double worst = 0;
  // Sizes below, at and past a block of 16, with a tail, and past one 4 Mi-element chunk.
  const std::vector<int64_t> sizes = {5, 16, 17, 100, 1000, 4103, (int64_t(1) << 22) + 23};
  for (int64_t n : sizes) {
    auto g = at::detail::createCPUGenerator(42);
    at::Tensor whole = at::empty({n});
    whole.normal_(0.0, 0.02, g);
    const at::Tensor next = at::empty({32}).normal_(0.0, 1.0, g);  // what the stream gives after it
    const int64_t big = n > 64 ? n / 2 + 3 : 0;
    for (const auto& range : std::vector<std::pair<int64_t, int64_t>>{
             {0, n}, {0, n / 2}, {n / 3, n - n / 3}, {n - 1, 1}, {big, n > 64 ? 40 : 0}, {0, 0}}) {
      const int64_t begin = range.first, count = range.second;
      CAPTURE(n);
      CAPTURE(begin);
      CAPTURE(count);
      auto h = at::detail::createCPUGenerator(42);
      at::Tensor part = at::empty({count});
      model::normal_range(part, n, begin, 0.0, 0.02, h);
      const double d = max_diff(part, whole.narrow(0, begin, count));
      worst = std::max(worst, d);
      CHECK(d == 0.0);
      CHECK(at::equal(at::empty({32}).normal_(0.0, 1.0, h), next));
    }
    auto s = at::detail::createCPUGenerator(42);
    model::skip_normal(n, s);
    CHECK(at::equal(at::empty({32}).normal_(0.0, 1.0, s), next));
  }
  MESSAGE("normal_range: max |difference| to the whole tensor's draws " << worst << " (tolerance 0: bit-equal)");
  // Negative control: a range drawn as if it were a tensor of its own differs.
  auto g = at::detail::createCPUGenerator(42), h = at::detail::createCPUGenerator(42);
  at::Tensor whole = at::empty({1000}).normal_(0.0, 0.02, g), alone = at::empty({500}).normal_(0.0, 0.02, h);
  const double control = max_diff(alone, whole.narrow(0, 500, 500));
  MESSAGE("negative control (a slice drawn alone): max |difference| " << control);
  CHECK(control > 1e-3);
}

TEST_CASE("normal_range on several threads draws the serial numbers and leaves the stream there") {
  // Past three 1 Mi-element thread chunks with a tail, so ranges start and
  // end inside chunks, in the tail, and skip whole chunks.
  const int64_t n = 3 * (int64_t(1) << 20) + 23;
  auto g = at::detail::createCPUGenerator(7);
  at::Tensor whole = at::empty({n});
  whole.normal_(0.0, 0.02, g);
  const at::Tensor next = at::empty({32}).normal_(0.0, 1.0, g);
  double worst = 0;
  for (int threads : {2, 3, 8}) {
    for (const auto& [begin, count] : std::vector<std::pair<int64_t, int64_t>>{
             {0, n}, {5, n - 40}, {(int64_t(1) << 20) + 7, int64_t(1) << 20}, {n - 30, 30}, {2 * (int64_t(1) << 20), 100}}) {
      CAPTURE(threads);
      CAPTURE(begin);
      CAPTURE(count);
      auto h = at::detail::createCPUGenerator(7);
      at::Tensor part = at::empty({count});
      model::normal_range(part, n, begin, 0.0, 0.02, h, threads);
      const double d = max_diff(part, whole.narrow(0, begin, count));
      worst = std::max(worst, d);
      CHECK(d == 0.0);
      CHECK(at::equal(at::empty({32}).normal_(0.0, 1.0, h), next));
    }
  }
  MESSAGE("normal_range on 2, 3, 8 threads: max |difference| to the serial draws " << worst << " (tolerance 0)");
  // A model whose embedding (4096 x 320 = 1.3 Mi elements) takes the threaded
  // path: every parameter equals the one-thread build's.
  model::GptConfig cfg;
  cfg.vocab = 4096, cfg.layers = 1, cfg.d_model = 320, cfg.heads = 4, cfg.seq_len = 16;
  const model::Gpt one(cfg, 99);
  model::BuildScope scope;
  scope.draw_threads = 4;
  const model::Gpt four(cfg, 99, scope);
  const auto a = one->named_parameters(), b = four->named_parameters();
  REQUIRE(a.size() == b.size());
  double model_worst = 0;
  for (size_t i = 0; i < a.size(); ++i) model_worst = std::max(model_worst, max_diff(a[i].value(), b[i].value()));
  MESSAGE("a GPT drawn on 4 threads vs 1: max |difference| over " << a.size() << " parameters " << model_worst);
  CHECK(model_worst == 0.0);
  // Negative control: another seed's model differs.
  const model::Gpt other(cfg, 100, scope);
  const double control = max_diff(one->named_parameters()[0].value(), other->named_parameters()[0].value());
  MESSAGE("negative control (seed 100): max |difference| in wte " << control);
  CHECK(control > 1e-3);
}

TEST_CASE("a pp-2 / tp-2 / ep-2 rank builds its share only, with the 1-process model's numbers") {
  const std::vector<std::vector<std::string>> specs = {
      {"model.layers=4", "model.d_model=32", "model.heads=4", "model.seq_len=16", "model.vocab=64",
       "model.moe.experts=4", "model.moe.top_k=2", "model.moe.every=2", "model.moe.d_ff=48"},
      {"model.kind=llama", "model.layers=4", "model.d_model=32", "model.heads=4", "model.kv_heads=2",
       "model.ffn_hidden=48", "model.seq_len=16", "model.vocab=64", "model.tie_embeddings=true",
       "model.moe.experts=4", "model.moe.top_k=2", "model.moe.every=2", "model.moe.d_ff=40"}};
  for (auto sets : specs) {
    for (const char* s : {"cluster.procs_per_node=4", "parallel.pp=2", "parallel.tp=2", "parallel.ep=2", "train.grad_accum=2"})
      sets.push_back(s);
    const dtrain::JobSpec spec = dtrain::parse_job_spec("", "s.yaml", sets);
    const model::GptConfig cfg = config_of(spec.model);
    const model::Gpt whole(cfg, 1234);
    std::map<std::string, at::Tensor> reference;
    for (const auto& item : whole->named_parameters()) reference[item.key()] = item.value();
    const dtrain::mesh::Mesh m = spec.mesh();
    for (int rank = 0; rank < spec.world(); ++rank) {
      const dtrain::mesh::Coord c = dtrain::mesh::coord_of(m, rank);
      const int pp_rank = dtrain::mesh::index_in_group(m, dtrain::mesh::GroupKind::pp, c);
      const int tp_rank = dtrain::mesh::index_in_group(m, dtrain::mesh::GroupKind::tp, c);
      int ep_rank = -1;  // its place in its ep group, as the communicator numbers it
      for (const auto& g : dtrain::mesh::groups(m, dtrain::mesh::GroupKind::ep))
        for (size_t i = 0; i < g.size(); ++i)
          if (g[i] == rank) ep_rank = int(i);
      const parallel::PipelineStage stage = parallel::pipeline_stage(spec.stage_layers(), pp_rank, 2);
      CAPTURE(spec.model.kind);
      CAPTURE(rank);
      // This rank's share of the 1-process model, cut the way parallelize() cuts it.
      int64_t share = 0;
      std::map<std::string, at::Tensor> want;
      for (const auto& [name, p] : reference) {
        if (!parallel::stage_keeps(name, stage, cfg.tie_embeddings)) continue;
        at::Tensor t = p;
        if (name.find(".moe.fc.") != std::string::npos || name.find(".moe.proj.") != std::string::npos) {
          t = p.narrow(0, ep_rank * p.size(0) / 2, p.size(0) / 2);
        } else {
          const parallel::ParamLayout l =
              parallel::tp_layout(name, p.sizes().vec(), cfg.kv(), tp_rank, 2, false, true);
          if (l.sharded()) t = parallel::tp_slice(p, l);
        }
        want[name] = t;
        share += t.numel();
      }
      const model::Gpt built(cfg, 1234, parallel::build_scope(spec, c));
      CHECK(built->num_params() == share);
      // The planner's figure for the build is this count (fp32).
      CHECK(dtrain::plan::plan_rank(spec, rank).build_bytes == 4 * built->num_params());
      CHECK(built->whole_num_params() == whole->num_params());
      double worst = 0;
      for (const auto& item : built->named_parameters()) {
        auto it = want.find(item.key());
        if (it == want.end()) {  // another stage's: released
          CHECK_MESSAGE(item.value().numel() == 0, item.key());
          continue;
        }
        REQUIRE_MESSAGE(item.value().sizes() == it->second.sizes(), item.key());
        worst = std::max(worst, max_diff(item.value(), it->second));
      }
      CHECK(worst == 0.0);
      if (rank == spec.world() - 1)
        MESSAGE(spec.model.kind << " rank " << rank << " of " << spec.world() << ": built " << built->num_params()
                                << " parameters, its share " << share << ", the whole model "
                                << whole->num_params() << "; max |difference| to the whole model's " << worst
                                << " (tolerance 0)");
    }
  }
}
