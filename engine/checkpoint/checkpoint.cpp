// Sharded save and index-based load of one rank's training state
// (checkpoint.h). Tensor names: "model/<param>", "optim/exp_avg/<param>",
// "optim/exp_avg_sq/<param>", "rng/{cpu,cuda}/rank_<r>". Which rank writes
// which model/optimizer slice is the layout's StateProvider's business (under
// DDP: the dp replicas split it by bytes); every rank writes its RNG states.
#include "engine/checkpoint/checkpoint.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/all.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <future>
#include <mutex>
#include <thread>
#include <unistd.h>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_reader.h"
#include "common/checkpoint_writer.h"
#include "common/error.h"
#include "common/log.h"
#include "common/mesh.h"
#include "common/model_signature.h"
#include "engine/device/device.h"

namespace dtrain::engine::checkpoint {
namespace ck = dtrain::checkpoint;
namespace {

volatile std::sig_atomic_t g_preempt = 0;

void on_sigterm(int) { g_preempt = 1; }

std::string dtype_name(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return "F32";
    case at::kDouble: return "F64";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kByte: return "U8";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    default:
      throw Error(ErrorCode::internal, std::string("checkpoint: unsupported dtype ") +
                                           std::string(c10::toString(t.scalar_type())));
  }
}

std::vector<int64_t> shape_of(const at::Tensor& t) { return t.sizes().vec(); }


// The slice `e` of a global tensor as this rank's shard of it. `keep` holds
// the host copy alive until the file is written.
void add_entry(std::vector<ck::ShardData>& out, std::vector<at::Tensor>& keep,
               const parallel::StateEntry& e) {
  keep.push_back(device::to_host(e.tensor.detach()));
  const at::Tensor& c = keep.back();
  std::vector<ck::Range> slice(e.slice.begin(), e.slice.end());
  ck::TensorEntry t{e.name, dtype_name(c), e.global_shape,
                    {ck::Shard{"", e.key.empty() ? e.name : e.key, slice, 0}}};
  out.push_back({std::move(t), c.data_ptr()});
}

// A whole tensor (RNG states).
void add_full(std::vector<ck::ShardData>& out, std::vector<at::Tensor>& keep, const std::string& name,
              const at::Tensor& t) {
  parallel::StateEntry e{name, shape_of(t), {}, t, ""};
  for (int64_t d : e.global_shape) e.slice.emplace_back(0, d);
  add_entry(out, keep, e);
}

std::string rank_file(int rank) { return "rank_" + std::to_string(rank) + ".safetensors"; }
// "rng/cpu/rank_<r>", and "rng/cuda/rank_<r>" for a rank on a GPU.
std::string rng_name(c10::Device d, int rank) {
  return "rng/" + device::rng_kind(d) + "/rank_" + std::to_string(rank);
}

std::vector<ck::ShardData> collect_shards(const TrainState& s, const std::vector<parallel::StateEntry>& entries,
                                          std::vector<at::Tensor>& keep) {
  std::vector<ck::ShardData> shards;
  for (const auto& e : entries) add_entry(shards, keep, e);
  const c10::Device cpu(c10::DeviceType::CPU);
  add_full(shards, keep, rng_name(cpu, s.info->rank), device::rng_state(cpu));
  if (!s.device.is_cpu())
    add_full(shards, keep, rng_name(s.device, s.info->rank), device::rng_state(s.device));
  return shards;
}

ck::Index index_header(const TrainState& s, int64_t step) {
  ck::Index x;
  x.step = step;
  x.mesh = mesh::format_mesh(s.info->mesh);
  x.world = s.info->world;
  x.model = model_signature(s.spec->model);
  x.sampler_consumed = s.sampler->state().consumed;
  x.optimizer_step = s.optimizer->step_count();
  x.schedule = {s.schedule->lr, s.schedule->min_lr, s.schedule->warmup_steps, s.schedule->total_steps};
  x.spec_yaml = job_spec_to_yaml(*s.spec);
  for (int r = 0; r < s.info->world; ++r) x.files.push_back(rank_file(r));
  return x;
}

// Reads straight into a contiguous CPU tensor; through a (pinned) host copy
// into anything else.
void read_into(ck::CheckpointReader& reader, const std::string& name, at::Tensor& dst,
               const std::vector<std::pair<int64_t, int64_t>>& slice) {
  const bool direct = dst.device().is_cpu() && dst.is_contiguous();
  at::Tensor c = direct ? dst
                        : at::empty(dst.sizes(), dst.options().device(c10::kCPU)
                                                     .pinned_memory(!dst.device().is_cpu()));
  reader.read_region(name, std::vector<ck::Range>(slice.begin(), slice.end()), c.data_ptr());
  if (!direct) dst.copy_(c);
}

void read_into(ck::CheckpointReader& reader, const std::string& name, at::Tensor& dst) {
  std::vector<std::pair<int64_t, int64_t>> all;
  for (int64_t d : dst.sizes()) all.emplace_back(0, d);
  read_into(reader, name, dst, all);
}

// This rank's saved stream of `d`'s generator; a rank the checkpoint has no
// stream for (more ranks now, or a CPU run resumed on a GPU) starts a new one
// from the seed, the step and its rank, and says so.
void restore_rng(ck::CheckpointReader& reader, const TrainState& s, const std::string& dir,
                 c10::Device d) {
  const ck::Index& x = reader.index();
  const std::string rng = rng_name(d, s.info->rank);
  if (x.find(rng)) {
    const ck::TensorEntry& e = reader.at(rng);
    at::Tensor state = at::empty(e.shape, at::kByte);
    read_into(reader, rng, state);
    device::set_rng_state(d, state);
    return;
  }
  const uint64_t seed = s.spec->job.seed + 7919ULL * uint64_t(s.info->rank) + 104729ULL * uint64_t(x.step);
  at::Generator gen = at::globalContext().defaultGenerator(d);
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  if (s.info->rank == (d.is_cpu() ? x.world : 0))  // once: the first rank without a stream
    DTRAIN_WARN("checkpoint {} holds no {} RNG stream for rank {}: it starts a new one", dir,
                device::rng_kind(d), s.info->rank);
}

// The first of this rank's model and optimizer tensors holding a NaN or inf
// ("" when all are finite): one reduction per tensor where it lives, one
// host sync for all of them.
std::string first_nonfinite(const std::vector<parallel::StateEntry>& entries) {
  std::vector<at::Tensor> ok;  // [1] bool each
  for (const auto& e : entries)
    if (c10::isFloatingType(e.tensor.scalar_type())) ok.push_back(at::isfinite(e.tensor.detach()).all().reshape({1}));
  if (ok.empty() || at::cat(ok).all().item<bool>()) return "";
  size_t i = 0;
  for (const auto& e : entries)
    if (c10::isFloatingType(e.tensor.scalar_type()) && !ok[i++].item<bool>()) return e.name;
  return "";
}

// Collective over the world: throws dtrain::Error(config) on every rank when
// any rank's state is not finite, before anything of step `step` is written.
void check_finite_state(const TrainState& s, const std::vector<parallel::StateEntry>& entries, int64_t step) {
  const std::string bad = first_nonfinite(entries);
  at::Tensor flag = at::full({1}, bad.empty() ? 0.0f : float(s.info->rank + 1), at::kFloat);  // [1]
  s.control->all_reduce(flag, /*async=*/false, comm::ReduceOp::max);
  const int worst = int(flag.item<float>()) - 1;  // the highest rank with non-finite state, -1: none
  if (worst < 0) return;
  throw Error(ErrorCode::config,
              "checkpoint of step " + std::to_string(step) + " not written: the training state holds NaN or inf (" +
                  (bad.empty() ? "rank " + std::to_string(worst) : "this rank's " + bad) + ")",
              "the run diverged; lower train.lr or clip gradients with train.grad_clip, and resume from the "
              "last checkpoint in checkpoint.dir = " + s.spec->checkpoint.dir);
}

}  // namespace

std::string model_signature(const ModelSpec& m) { return ck::model_signature(m); }

std::string prepare_resume(const TrainState& s) {
  const std::string& root = s.spec->checkpoint.dir;
  if (root.empty()) return "";
  if (s.info->rank == 0) {
    const int removed = ck::clean_stale(root);
    if (removed > 0) DTRAIN_WARN("checkpoint: removed {} unfinished .tmp entr{} in {}", removed,
                                 removed == 1 ? "y" : "ies", root);
  }
  s.control->barrier();
  return ck::latest_dir(root);
}

namespace detail {

namespace {

// Host buffers for the copies a save or an in-memory copy takes, reused once
// every writer has dropped them: a copy into pages already mapped runs at
// memory speed, where a fresh clone of the state pays as long again in page
// faults (a 175-MB state: 25-30 ms reused, 40-75 ms cloned, on the training
// thread). At most kPooledSets sets, the training thread's only; a set of
// other shapes (a round resharded the state) is replaced once it is free.
constexpr size_t kPooledSets = 2;  // one save and one in-memory copy in flight

std::vector<std::vector<at::Tensor>>& snapshot_pool() {
  static std::vector<std::vector<at::Tensor>> pool;
  return pool;
}

// No save, copy or writer holds any of `set` (only the pool does).
bool unused(const std::vector<at::Tensor>& set) {
  for (const auto& t : set)
    if (t.use_count() != 1 || t.storage().use_count() != 1) return false;
  std::atomic_thread_fence(std::memory_order_acquire);  // the writers' last reads come before our writes
  return true;
}

bool alike(const std::vector<at::Tensor>& set, const std::vector<at::Tensor>& live) {
  if (set.size() != live.size()) return false;
  for (size_t i = 0; i < set.size(); ++i)
    if (set[i].sizes() != live[i].sizes() || set[i].scalar_type() != live[i].scalar_type()) return false;
  return true;
}

// Buffers for copies of `live` (CPU tensors), contiguous, aliasing nothing
// live: a free pooled set, or a new one (pooled while there is room).
std::vector<at::Tensor> host_buffers(const std::vector<at::Tensor>& live) {
  auto& pool = snapshot_pool();
  for (auto& set : pool)
    if (alike(set, live) && unused(set)) return set;
  std::vector<at::Tensor> fresh;
  for (const auto& t : live) fresh.push_back(at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous)));
  if (pool.size() < kPooledSets) {
    pool.push_back(fresh);
  } else {
    for (auto& set : pool)
      if (!alike(set, live) && unused(set)) {  // another round's shapes: its memory goes
        set = fresh;
        break;
      }
  }
  return fresh;
}

// The host copies being taken in the background, for wait_for_host_copies
// (the training thread's only).
std::vector<std::shared_future<void>>& copies_in_flight() {
  static std::vector<std::shared_future<void>> v;
  return v;
}

// Copies from[i] into to[i] on a thread of its own; the references are
// dropped when it is done (the pool sees the buffers free once every writer
// has dropped them too). With `log`, says how long the copy of `step` took.
std::shared_future<void> copy_in_background(std::vector<at::Tensor> from, std::vector<at::Tensor> to, int64_t step,
                                            bool log) {
  auto task = std::make_shared<std::packaged_task<void()>>([from = std::move(from), to = std::move(to), step,
                                                            log]() mutable {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t bytes = 0;
    for (size_t i = 0; i < to.size(); ++i) {
      to[i].copy_(from[i]);
      bytes += to[i].numel() * int64_t(to[i].element_size());
    }
    from.clear();
    to.clear();
    if (log)
      DTRAIN_INFO("host copies of step {} taken in the background: {:.1f} MB in {:.1f} ms", step, double(bytes) / 1e6,
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  });
  std::shared_future<void> done = task->get_future().share();
  std::thread([task] { (*task)(); }).detach();
  copies_in_flight().push_back(done);
  return done;
}

// Whether this rank's host copies may be taken while the next step runs:
// its state says it stays put until the optimizer (StateProvider), lives in
// host memory and is not paged by an offload store.
bool copy_while_training(const TrainState& s) {
  return s.state->stable_until_optimizer() && s.optimizer->offload_store() == nullptr;
}

PreparedSave snapshot(const TrainState& s, const std::vector<parallel::StateEntry>& entries, int64_t step,
                      bool copy) {
  const std::string& root = s.spec->checkpoint.dir;
  PreparedSave p;
  p.step = step;
  p.dir = ck::tmp_dir(root, step);
  p.file = rank_file(s.info->rank);
  p.shards = collect_shards(s, entries, p.keep);
  if (copy) {  // on a CPU, to_host is the live tensor itself: training must not change what is written
    std::vector<size_t> live;
    std::vector<at::Tensor> tensors;
    for (size_t i = 0; i < p.keep.size(); ++i)
      if (p.keep[i].device().is_cpu() && !p.keep[i].is_pinned()) {
        live.push_back(i);
        tensors.push_back(p.keep[i]);
      }
    const std::vector<at::Tensor> copies = host_buffers(tensors);
    for (size_t j = 0; j < live.size(); ++j) {
      p.keep[live[j]] = copies[j];
      p.shards[live[j]].data = copies[j].data_ptr();
    }
    if (copy_while_training(s)) {
      p.copied = copy_in_background(std::move(tensors), copies, step, s.info->rank == 0);
    } else {
      for (size_t j = 0; j < live.size(); ++j) p.keep[live[j]].copy_(tensors[j]);
    }
  }
  if (s.info->rank == 0) p.index = index_header(s, step);  // the state as of this step
  if (crash_during_save(s.spec->fault, *s.info, step))
    // fault.kind crash_during_save: SIGKILLed after writing about half the
    // shard, leaving step_<N>.tmp behind as a real crash would
    p.options.progress = [](uint64_t written, uint64_t total) {
      if (2 * written >= total) ::raise(SIGKILL);  // mid-file: header and part of the data on disk
    };
  return p;
}

}  // namespace

PreparedSave prepare_save(const TrainState& s, int64_t step, bool copy) {
  const std::vector<parallel::StateEntry> entries = s.state->save_entries();
  check_finite_state(s, entries, step);  // collective: no rank writes non-finite state
  if (s.info->rank == 0) ck::prepare_tmp_dir(s.spec->checkpoint.dir, step);
  s.control->barrier();  // the .tmp dir exists for everyone
  return snapshot(s, entries, step, copy);
}

PreparedSave take_snapshot(const TrainState& s, int64_t step) {
  return snapshot(s, s.state->save_entries(), step, /*copy=*/true);
}

std::string first_nonfinite_copy(const PreparedSave& p) {
  wait_copied(p);
  std::vector<parallel::StateEntry> entries;
  for (size_t i = 0; i < p.keep.size(); ++i) entries.push_back({p.shards[i].entry.name, {}, {}, p.keep[i], ""});
  return first_nonfinite(entries);
}

uint64_t write_prepared(PreparedSave& p) {
  wait_copied(p);
  const uint64_t bytes = ck::write_rank_file(p.dir, p.file, std::move(p.shards), p.options);
  p.shards.clear();
  p.keep.clear();  // the host copies are written: free them
  return bytes;
}

std::vector<ck::ShardData> rank_shards(const TrainState& s, std::vector<at::Tensor>& keep) {
  return collect_shards(s, s.state->save_entries(), keep);
}

ck::Index index_of(const TrainState& s, int64_t step) { return index_header(s, step); }

void commit_prepared(const TrainState& s, PreparedSave& p) {
  s.control->barrier();  // every rank file is written and fsynced
  if (s.info->rank == 0) {
    ck::write_index(p.dir, std::move(p.index));
    ck::commit(s.spec->checkpoint.dir, p.step, s.spec->checkpoint.keep);
  }
  s.control->barrier();  // committed: nobody runs ahead of `latest`
}

void wait_copied(const PreparedSave& p) {
  if (p.copied.valid()) p.copied.get();
}

}  // namespace detail

double wait_for_host_copies() {
  auto& copies = detail::copies_in_flight();
  if (copies.empty()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  bool waited = false;
  for (const auto& c : copies)
    if (c.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      waited = true;
      c.wait();  // a failed copy is the writers' to report (wait_copied)
    }
  copies.clear();
  return waited ? std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() : 0.0;
}

SaveStats save(const TrainState& s, int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  detail::PreparedSave p = detail::prepare_save(s, step, /*copy=*/false);
  SaveStats stats;
  const auto w0 = std::chrono::steady_clock::now();
  stats.bytes = detail::write_prepared(p);
  stats.write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  detail::commit_prepared(s, p);
  stats.dir = s.spec->checkpoint.dir + "/" + ck::step_dir_name(step);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

int64_t load(const TrainState& s, const std::string& dir, bool weights_only) {
  ck::CheckpointReader reader(dir);
  const ck::Index& x = reader.index();
  weights_only = weights_only || x.weights_only;
  std::vector<parallel::StateEntry> entries = s.state->load_entries();
  if (weights_only)  // the model's tensors; everything else as a fresh run has it
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [](const auto& e) { return e.name.rfind("model/", 0) != 0; }),
                  entries.end());
  std::vector<ck::ExpectedTensor> expected;
  for (const auto& e : entries)
    if (expected.empty() || expected.back().name != e.name)  // a tensor's slices come together
      expected.push_back({e.name, dtype_name(e.tensor), e.global_shape});
  ck::check_compatible(x, dir, weights_only ? x.model : model_signature(s.spec->model), expected);

  at::NoGradGuard no_grad;
  for (auto& e : entries) read_into(reader, e.name, e.tensor, e.slice);
  if (weights_only) return 0;
  if (s.spec->fault.kind == FaultKind::reset_moments_on_load && s.info->restart == 0) {
    // fault.kind reset_moments_on_load (a wrong resume on purpose): the
    // moments as a fresh AdamW has them; the step count is still loaded.
    if (s.info->rank == 0)
      DTRAIN_WARN("fault.kind = reset_moments_on_load: AdamW's moments from {} are set to zero", dir);
    for (auto& e : entries)
      if (e.name.rfind("optim/", 0) == 0) e.tensor.zero_();
  }
  s.optimizer->set_step_count(x.optimizer_step);
  s.sampler->load_state({x.sampler_consumed});

  const c10::Device cpu(c10::DeviceType::CPU);
  restore_rng(reader, s, dir, cpu);
  if (!s.device.is_cpu()) restore_rng(reader, s, dir, s.device);
  return x.step;
}

int64_t load_model(const TrainState& s, const std::string& dir) {
  ck::CheckpointReader reader(dir);
  // A weights-only checkpoint (a Hugging Face import) holds the model's
  // tensors alone: no MoE balancing state, matched by name and shape.
  const bool weights_only = reader.index().weights_only;
  std::vector<parallel::StateEntry> entries;
  for (auto& e : s.state->load_entries())
    if (weights_only ? e.name.rfind("model/", 0) == 0 : e.name.rfind("optim/", 0) != 0) entries.push_back(e);
  std::vector<ck::ExpectedTensor> expected;
  for (const auto& e : entries)
    if (expected.empty() || expected.back().name != e.name)
      expected.push_back({e.name, dtype_name(e.tensor), e.global_shape});
  ck::check_compatible(reader.index(), dir, weights_only ? reader.index().model : model_signature(s.spec->model),
                       expected);
  at::NoGradGuard no_grad;
  for (auto& e : entries) read_into(reader, e.name, e.tensor, e.slice);
  return reader.index().step;
}

void install_preemption_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
}

// The flag travels in an async all-reduce started after step k and read
// after step k+1, so its latency hides behind a step's compute (a 1-float
// collective costs milliseconds on a loaded machine). All ranks read the
// same reduced value, so they stop after the same step.
bool preemption_requested(comm::Group& control, PreemptionPoll& p, bool last) {
  bool stop = false;
  if (p.work) {
    p.work->wait();
    p.work.reset();
    stop = p.flag.item<float>() > 0;
  }
  if (!stop && !last) {
    p.flag = at::full({1}, g_preempt ? 1.0f : 0.0f, at::kFloat);
    p.work = control.all_reduce(p.flag, /*async=*/true);
  }
  return stop;
}

}  // namespace dtrain::engine::checkpoint
