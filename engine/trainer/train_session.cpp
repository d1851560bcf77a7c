// make_train_session (train_session.h): the set-up half of the trainer, in
// the order every rank must follow (init_comm and the DDP broadcast are
// collective), plus the memory figures. The loop is in trainer.cpp.
#include "engine/trainer/train_session.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/log.h"
#include "common/machine_memory.h"
#include "common/offload_files.h"
#include "engine/comm/round_abort.h"
#include "engine/comm/symmetric_buffer.h"
#include "engine/device/counting_allocator.h"
#include "engine/device/device.h"
#include "engine/doctor/blas_check.h"
#include "engine/data/indexed_blend.h"
#include "engine/doctor/engine_facts.h"
#include "engine/trainer/evaluation.h"
#include "plan/combinations.h"

namespace dtrain::engine::trainer {
namespace {

std::unique_ptr<data::TokenDataset> open_data(const JobSpec& spec) {
  const auto& d = spec.data;
  // An indexed dataset's path is a prefix: its files are checked by name in open_dataset.
  if (d.format != DataFormat::synthetic && d.format != DataFormat::indexed && !std::filesystem::exists(d.path))
    throw Error(ErrorCode::config,
                "data.path = " + d.path + " does not exist (working directory " +
                    std::filesystem::current_path().string() + ")",
                d.path == "data/corpus.txt" ? "run scripts/make-corpus to build data/corpus.txt"
                                            : "point data.path at an existing file");
  if (d.format == DataFormat::indexed) {
    // Documents shuffled per epoch, blends by share (indexed_blend.h).
    std::vector<data::IndexedSource> sources;
    for (const DataSource& src : d.indexed_sources()) sources.push_back({src.path, src.weight});
    return data::open_indexed_training(sources, spec.model.seq_len, spec.model.vocab, spec.job.seed);
  }
  return data::open_dataset(to_string(d.format), d.path, spec.model.seq_len, spec.model.vocab, spec.job.seed);
}

model::GptConfig gpt_config(const ModelSpec& m) {
  model::GptConfig c;
  c.vocab = m.vocab;
  c.layers = m.layers;
  c.d_model = m.d_model;
  c.heads = m.heads;
  c.seq_len = m.seq_len;
  c.dropout = m.dropout;
  c.moe.experts = m.moe.experts;
  c.moe.top_k = m.moe.top_k;
  c.moe.capacity_factor = m.moe.capacity_factor;
  c.moe.aux_loss_coef = m.moe.aux_loss_coef;
  c.moe.every = m.moe.every;
  c.moe.d_ff = m.moe.d_ff;
  c.moe.bias_balance = m.moe.balance == MoeBalance::bias;
  c.attention = to_string(m.attention);  // the model's own name for its core (attention_core.h)
  c.kind = m.kind;
  c.kv_heads = m.kv_heads;
  c.ffn_hidden = m.ffn_hidden;
  c.norm_eps = m.norm_eps;
  c.rope = {m.rope_theta, m.rope_scaling.factor, m.rope_scaling.low_freq_factor, m.rope_scaling.high_freq_factor,
            m.rope_scaling.original_max_position};
  c.tie_embeddings = m.tie_embeddings;
  return c;
}

std::unique_ptr<optim::AdamW> make_optimizer(const JobSpec& spec, parallel::OptimizerParams p) {
  optim::AdamWOptions o;
  o.lr = spec.train.lr;
  o.beta1 = spec.train.beta1;
  o.beta2 = spec.train.beta2;
  o.eps = spec.train.adam_eps;
  o.weight_decay = spec.train.weight_decay;
  o.allocate_state = spec.train.offload.optimizer == OffloadTarget::none;  // else offload_optimizer, next
  auto adamw = std::make_unique<optim::AdamW>(std::move(p.params), std::move(p.decay), o, std::move(p.grads));
  if (p.page) adamw->set_pager({std::move(p.page_group), std::move(p.page)});  // train.offload.params
  return adamw;
}

// This rank's share of the CPUs it may run on: the threads it uses for work
// off the training loop's one thread (host offload's update; drawing the
// initial weights, before any rank trains).
int cpu_share(const comm::WorldInfo& info) { return std::max(1, usable_cpus() / std::max(1, info.local_world)); }

// train.offload.optimizer: AdamW's moments in a file per rank under
// train.offload.path (named by job and rank; a launch replaces the file an
// earlier, killed one left, and rank 0 removes those of ranks beyond this
// world), or in host memory, pinned for the GPU.
void offload_optimizer(const JobSpec& spec, const comm::WorldInfo& info, const c10::Device& device,
                       optim::AdamW& optimizer) {
  const OffloadSpec& o = spec.train.offload;
  if (o.optimizer == OffloadTarget::none) return;
  optim::OffloadOptions opt;
  opt.nvme = o.optimizer == OffloadTarget::nvme;
  opt.pinned = !opt.nvme && !device.is_cpu();
  opt.bucket_floats = std::max<int64_t>(1, int64_t(o.bucket_mb * 1024 * 1024 / 8));
  if (opt.nvme) opt.file = offload_file(o.path, spec.job.name, info.rank);
  opt.drop_writes = spec.fault.kind == FaultKind::offload_no_writeback;
  if (!opt.nvme && !device.is_cpu()) {
    // ZeRO-Offload's CPU Adam runs on the host's cores: a GPU rank leaves
    // them idle otherwise.
    opt.threads = cpu_share(info);
    DTRAIN_INFO("train.offload.optimizer host: AdamW's update on {} CPU thread(s) ({} CPUs, {} local rank(s))",
                opt.threads, usable_cpus(), info.local_world);
  }
  optimizer.offload(opt, o.prefetch);
}

// The model, its parallel layout, the optimizer and the checkpoint's view of
// them. `draw`: the initial weights drawn from job.seed and made the same on
// every replica; false when a restore overwrites every one of them
// (draw_init), which skips the draws and the data-parallel broadcast.
void build_model(TrainSession& s, bool draw) {
  const JobSpec& spec = s.spec;
  // Initialised on the CPU from job.seed (the same numbers on every device
  // and every rank), built as this rank's share only (its stage, its tp
  // slices, its experts), moved, then laid out by parallelize.
  model::BuildScope scope = parallel::build_scope(spec, s.info.coord);
  scope.draw = draw;
  scope.draw_threads = cpu_share(s.info);
  model::Gpt model(gpt_config(spec.model), spec.job.seed, scope);
  model->to(s.device);
  model->train();
  s.model_params = model->whole_num_params();  // the whole model, before any split
  s.flops_per_step = model_flops_per_step(double(s.model_params), spec.model,
                                          double(spec.global_batch()) * double(spec.model.seq_len));
  // train.offload's files of ranks beyond this world (an earlier, larger
  // launch killed before it could remove them) go; each rank replaces its own.
  const OffloadSpec& off = spec.train.offload;
  if (s.info.rank == 0 && (off.optimizer == OffloadTarget::nvme || off.params == OffloadTarget::nvme))
    remove_offload_files(off.path, spec.job.name, s.info.world);
  parallel::ParallelizeOptions popt;
  popt.sync_initial_params = draw;
  s.par = parallel::parallelize(spec, *s.comm, std::move(model), popt);
  s.optimizer = make_optimizer(spec, s.par.grad_sync->optimizer_params());
  offload_optimizer(spec, s.info, s.device, *s.optimizer);
  s.state = s.par.grad_sync->state(*s.optimizer);
}

// Whether the weights are drawn: yes unless `may_skip` and every rank
// expects to restore its whole state (a collective: the layouts'
// broadcasts stay matched): the checkpoint `dtrain resume` names, one on
// disk, or in a restarted round the nodes' in-memory copies. Where the
// restore then finds nothing to load, run_training builds it again, drawn
// (rebuild_drawn).
bool draw_init(TrainSession& s, bool may_skip) {
  if (!may_skip) return true;
  const int nodes = s.info.world / std::max(1, s.info.local_world);
  bool on_disk = false;
  try {  // a `latest` that names no step is refused by the resume, as before; here: draw
    on_disk = !s.spec.checkpoint.dir.empty() && !dtrain::checkpoint::latest_dir(s.spec.checkpoint.dir).empty();
  } catch (const std::exception&) {
  }
  const bool expect = !s.info.resume_from.empty() || on_disk ||
                      (s.info.restart > 0 && !s.info.memory_dir.empty() && s.spec.checkpoint.memory_on(nodes));
  at::Tensor t = at::full({1}, expect ? 1.0 : 0.0, at::TensorOptions().dtype(at::kDouble));  // [1]
  s.comm->control().all_reduce(t, /*async=*/false, comm::ReduceOp::min);
  return t.item<double>() < 0.5;
}

}  // namespace

std::unique_ptr<TrainSession> make_train_session(bool skip_init_if_restoring) {
  auto s = std::make_unique<TrainSession>();
  s->info = comm::WorldInfo::from_env();
  if (s->info.spec_path.empty())
    throw Error(ErrorCode::config, "DTRAIN_SPEC is not set",
                "run the builtin worker through `dtrain launch SPEC`");
  // Before any tensor of the run exists, so the step peak counts them all.
  device::install_counting_cpu_allocator();
  s->spec = load_job_spec(s->info.spec_path);
  const JobSpec& spec = s->spec;
  // The agent writes DTRAIN_SPEC for this round: its dp (and grad_accum) are
  // the round's. Another dp means the file was rewritten under this worker,
  // and training on would draw another global batch: stop, loudly.
  if (std::getenv("DTRAIN_MESH") && spec.parallel.dp != s->info.mesh.dp())
    throw Error(ErrorCode::internal,
                "DTRAIN_SPEC = " + s->info.spec_path + " has parallel.dp = " + std::to_string(spec.parallel.dp) +
                    " but this worker's round has dp " + std::to_string(s->info.mesh.dp()) + " (DTRAIN_MESH=" +
                    std::getenv("DTRAIN_MESH") + "): the file holds another round's spec",
                "each agent writes the round's spec before its workers start; a restart writes it again");
  plan::check_combinations(spec);  // the CLI checked it too; a worker may be given a spec some other way
  if (spec.fault.active())
    DTRAIN_WARN("FAULT INJECTION ON: fault.kind = {} (rank {}, step {}); this run fails on purpose",
                to_string(spec.fault.kind), spec.fault.rank, spec.fault.step);
  // One intra-op thread per rank: ranks are the parallelism (the launcher
  // also sets OMP/OPENBLAS_NUM_THREADS).
  at::set_num_threads(1);
  // Before any collective: a kernel override the CPU cannot run (SIGILL) or
  // a BLAS that computes wrong numbers stops here, naming the variable.
  const doctor::GemmCheck blas_check = doctor::check_libtorch_gemm_or_throw();
  // Dropout differs per rank, as in PyTorch DDP; the model's init does not
  // use this generator (it draws from its own, seeded by job.seed).
  at::manual_seed(spec.job.seed + 7919ULL * uint64_t(s->info.rank));

  s->device = device::select(to_string(spec.cluster.device), s->info.local_rank, s->info.local_world);

  comm::CommOptions copt;
  copt.backend = spec.cluster.backend != CommBackend::automatic ? to_string(spec.cluster.backend)
                 : s->device.is_cpu()                           ? "gloo"
                                                                : "nccl";
  copt.device = s->device;
  copt.shm = spec.cluster.shm;
  copt.hierarchical = spec.cluster.hier_allreduce;
  copt.gloo_native_reduce_scatter = spec.cluster.gloo_reduce_scatter == GlooReduceScatter::native;
  s->comm = comm::init_comm(s->info, copt);
  s->dp = &s->comm->group(mesh::gradient_group(s->info.mesh.cp()));  // every replica of this shard: dp x cp
  // Every rank, into its own log: the coordinates `dtrain topo` shows for it.
  DTRAIN_INFO("rank {} coordinates {} in mesh {}", s->info.rank, mesh::describe(s->info.mesh, s->info.coord),
              mesh::describe(s->info.mesh));
  s->peak = measure_device_peak(spec, s->device, s->info.local_world, s->comm->control());
  if (s->is_log_rank()) {
    DTRAIN_INFO("job {} from {} (seed {})", spec.job.name, spec.source, spec.job.seed);
    std::string summary = job_spec_summary(spec);
    if (!summary.empty() && summary.back() == '\n') summary.pop_back();
    DTRAIN_INFO("derived sizes:\n{}", summary);
  }

  s->data = open_data(spec);
  s->sampler = std::make_unique<data::DistributedSampler>(
      // Samples go by the dp coordinate: the cp ranks of a replica share them;
      // the tail data.valid.split holds out is never drawn.
      training_windows(spec, s->data->num_samples()), spec.job.seed, s->info.mesh.dp(), s->info.coord[mesh::Axis::dp],
      spec.train.micro_batch, spec.train.grad_accum, /*shuffle=*/!s->data->orders_itself());
  s->init_skipped = !draw_init(*s, skip_init_if_restoring);
  build_model(*s, /*draw=*/!s->init_skipped);
  if (s->init_skipped && s->is_log_rank())
    DTRAIN_INFO("initial weights not drawn: every rank restores its state next (a checkpoint or in-memory copy)");
  const int64_t model_params = s->model_params;
  s->schedule.lr = spec.train.lr;
  s->schedule.min_lr = spec.train.min_lr;
  s->schedule.warmup_steps = spec.train.warmup_steps;
  s->schedule.total_steps = spec.train.steps;
  const auto host = at::TensorOptions().dtype(at::kLong).pinned_memory(!s->device.is_cpu());
  s->inputs = at::empty({spec.train.micro_batch, spec.model.seq_len}, host);   // [B, T]
  s->targets = at::empty({spec.train.micro_batch, spec.model.seq_len}, host);  // [B, T]
  s->inputs_dev = s->device.is_cpu() ? s->inputs : at::empty_like(s->inputs, host.device(s->device).pinned_memory(false));
  s->targets_dev = s->device.is_cpu() ? s->targets : at::empty_like(s->targets, host.device(s->device).pinned_memory(false));

  if (s->is_log_rank()) {
    const BlasFacts blas = doctor::blas_facts();
    DTRAIN_INFO("doctor: BLAS {} {} ({}), start-up check max rel err {:.1e}; matmul {:.1f} GFLOP/s "
                "{} per rank ({}); MFU peak {:.1f} GFLOP/s over {} ranks ({} cores here, {} local ranks)",
                blas.name, blas.version, blas.core, blas_check.max_rel_err, s->peak.measured_gflops,
                to_string(spec.train.precision), s->device.is_cpu() ? "1 thread, CPU time" : s->device.str(),
                s->peak.total_flops / 1e9, s->info.world, s->peak.cores, s->info.local_world);
    const PeakSpread spread = peak_spread(s->peak.rank_gflops);
    if (s->info.world > 1)
      DTRAIN_INFO("doctor: the ranks' matmul rates: min {:.1f} (rank {}), median {:.1f}, max {:.1f} GFLOP/s",
                  spread.min, spread.slowest_rank, spread.median, spread.max);
    if (spread.slow)
      DTRAIN_WARN("doctor: rank {}'s matmul rate {:.1f} GFLOP/s is {:.0f}% of the ranks' median {:.1f}: its {} is "
                  "slower (throttled, or shared with another load) and sets a synchronous step's pace; MFU's peak "
                  "counts every rank's own rate. Fix: move that rank's host or core out of the job, or free it",
                  spread.slowest_rank, spread.min, 100.0 * spread.min / spread.median, spread.median,
                  s->device.is_cpu() ? "core" : "device");
  }
  if (s->is_log_rank())
    DTRAIN_INFO("model {}: {} parameters ({} tensors); data {} samples of {} tokens; {}; "
                "schedule {}; device {}, {}",
                spec.model.kind, model_params, s->par.parts.named_params.size(),
                s->data->num_samples(), spec.model.seq_len, s->par.grad_sync->describe(),
                s->par.schedule->name(), s->device.str(), to_string(spec.train.precision));
  return s;
}

void offload_fault_after_step(TrainSession& s, int64_t steps_done) {
  const FaultSpec& f = s.spec.fault;
  if (f.kind != FaultKind::offload_truncate && f.kind != FaultKind::offload_delete) return;
  if (s.info.restart != 0 || s.info.rank != f.rank || steps_done != f.step) return;
  // Every nvme file of the rank: AdamW's moments, the parameter shards.
  std::vector<std::pair<std::string, int64_t>> files;  // path, size
  if (optim::OffloadStore* store = s.optimizer->offload_store(); store && store->nvme()) {
    store->drain();  // the step's writes land first, so the damage is what the next step meets
    files.emplace_back(store->file(), store->bytes());
  }
  if (optim::OffloadFile* params = s.par.grad_sync->offloaded_params(); params && !params->file().empty()) {
    params->drain();
    files.emplace_back(params->file(), params->bytes());
  }
  for (const auto& [file, bytes] : files) {
    DTRAIN_WARN("fault.kind = {}: {} {} after step {}", to_string(f.kind),
                f.kind == FaultKind::offload_truncate ? "truncating" : "deleting", file, steps_done);
    std::error_code ec;
    if (f.kind == FaultKind::offload_delete)
      std::filesystem::remove(file, ec);
    else
      std::filesystem::resize_file(file, bytes / 2, ec);
  }
}

void rebuild_drawn(TrainSession& s) {
  s.state.reset();
  s.optimizer.reset();
  s.par = parallel::Parallelized();
  build_model(s, /*draw=*/true);
  s.init_skipped = false;
}

TrainSession::~TrainSession() {
  if (comm && comm::leaving_round()) (void)comm.release();  // see the declaration
}

int64_t measured_peak_bytes() { return device::cpu_peak_bytes() + comm::shm_buffer_bytes(); }

MemoryStats TrainSession::memory() const {
  MemoryStats m;
  m.rss = process_rss_bytes();
  const parallel::ModelBytes b = par.grad_sync->memory();
  m.params = b.params;
  m.grads = b.grads;
  m.shm = comm::shm_buffer_bytes();
  m.peak = measured_peak_bytes();
  m.optimizer = optimizer->resident_bytes();  // offloaded: its staging buffers only
  return m;
}

}  // namespace dtrain::engine::trainer
