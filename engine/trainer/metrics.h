// Training metrics (docs/ARCHITECTURE.md, 'The engine's folders'): every
// log.every steps (and the first and last) rank 0 prints step/total, the
// global-batch mean loss, lr, tokens/s, ETA and memory (and val_loss on the
// steps data.valid is evaluated, logged or not), and appends one JSON
// object to <log dir>/metrics.jsonl (valid JSON always: a NaN or inf is written
// as null, and a non-finite step carries "nonfinite": true), mirrored into
// TensorBoard event files (common/tensorboard.h). Owns the timing
// and formatting; it does not train or decide the loss value.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::engine::trainer {

// Bytes held by the training state (process RSS from /proc/self/statm).
struct MemoryStats {
  int64_t rss = 0;
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  // Most CPU tensor bytes alive at once during the step: the counting
  // allocator's peak plus `shm`, the bytes this rank holds in shared-memory
  // buffers (comm::shm_buffer_bytes: DDP's buckets, ZeRO's reduce-scatter
  // inputs, its share of ZeRO-3's shared parameters), alive the whole step.
  int64_t peak = 0;
  int64_t shm = 0;
};
int64_t process_rss_bytes();

// `name` as the inside of a JSON string (quotes, backslashes and control
// characters escaped): file base names as keys.
std::string json_escaped(const std::string& name);

// What one step reports to the logger.
struct StepReport {
  int64_t step = 0;       // 1-based: steps done
  double loss = 0;        // global-batch mean (already reduced over dp)
  double lr = 0;
  double grad_norm = 0;   // before clipping
  double step_s = 0;      // wall time of the step
  double sync_wait_s = 0; // exposed gradient all-reduce time (Ddp::finish_gradient_sync)
  int buckets_in_backward = 0;  // DDP buckets whose all-reduce started during backward
  int64_t dp_bytes_sent = 0;    // bytes this rank sent through the dp group in the step
  int64_t tp_bytes_sent = 0;    // ... and through the tp group (forward and backward)
  int slowest_rank = -1;        // logged steps: the rank with the most compute (straggler.h)
  double straggler_ratio = 0;   // its compute / the median rank's
  bool nonfinite = false;       // the loss or gradient norm is NaN or inf (the update was skipped)
  std::vector<std::pair<std::string, double>> extra{};  // GradSync::step_metrics (e.g. moe_max_load)
  // Tokens drawn per data source since the start of training (indexed data):
  // "data_tokens": {"<base name>": n, ...} in metrics.jsonl.
  std::vector<std::pair<std::string, int64_t>> data_tokens{};
  // data.valid.blend, on an evaluated step: each file's own val_loss,
  // "val_loss_by_source": {"<base name>": x, ...} (TensorBoard:
  // val_loss_by_source/<base name>).
  std::vector<std::pair<std::string, double>> val_loss_by_source{};
  // data.valid evaluated after this step (evaluation.h): the step is logged
  // with val_loss, val_ppl and eval_ms (its wall time, outside step_s).
  bool evaluated = false;
  double val_loss = 0, val_ppl = 0, eval_ms = 0;
  // log.live_peak, on a logged step: the ranks' matmul peak measured beside
  // the interval's steps (FLOP/s, mfu.h's LivePeak; 0 = not measured).
  // The record gains peak_flops_live and mfu_live, the interval's mean step
  // against it.
  double live_peak_flops = 0;
};

struct MetricsOptions {
  int64_t total_steps = 0;
  int every = 10;
  int64_t tokens_per_step = 0;  // global batch * seq_len
  double flops_per_step = 0;    // model FLOPs of one step (mfu.h)
  double peak_flops = 0;        // the ranks' measured matmul peak, FLOP/s (0 = no mfu)
  std::string jsonl_path;       // "" = no file
  bool truncate = true;         // fresh run: start a new file; resumed: append
  // Each mesh axis of > 1 rank and where its collectives go (comm::Group::path:
  // "shm", "gloo", "nccl"): "comm_path": {"dp": "shm", ...} in every record.
  std::vector<std::pair<std::string, std::string>> comm_paths;
  // log.tensorboard: every record also as scalars in event files under this
  // directory ("" = none), and the resolved spec as text (common/tensorboard.h).
  std::string tensorboard_dir;
  std::string spec_yaml;
  int64_t start_step = 0;  // the step the run starts after (a resume's checkpoint)
};

}  // namespace dtrain::engine::trainer
namespace dtrain::tb {
class TensorBoardWriter;
}  // namespace dtrain::tb
namespace dtrain::engine::trainer {

class MetricsLogger {
 public:
  explicit MetricsLogger(MetricsOptions options);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Same answer on every rank: whether step `step` (1-based) is logged (the
  // first, every `every`-th and the last).
  bool should_log(int64_t step) const;
  // Every step: accumulates timing. On rank 0 for logged steps (and every
  // non-finite or evaluated one): prints and appends one JSON line.
  void record(const StepReport& report, const MemoryStats& memory, bool print);
  // A record of its own after a step's checkpoint work (on rank 0, every
  // step that did some): {"step", "ckpt_block_ms"[, "ckpt_write_ms"][, "memory_copy_ms"]}
  // (after_step's StepSave; a time < 0 is left out).
  void record_checkpoint(int64_t step, double block_ms, double write_ms, double memory_copy_ms, bool print);

 private:
  struct Timing {  // the logged interval's figures
    double tokens_per_s, elapsed_s, cpu_s, step_s, wait_s, mfu;
    double mfu_live;  // against StepReport::live_peak_flops (0 = none)
  };
  // One metrics.jsonl record, newline included.
  std::string jsonl_line(const StepReport& r, const MemoryStats& mem, const Timing& t) const;

  MetricsOptions opt_;
  std::FILE* jsonl_ = nullptr;
  std::unique_ptr<tb::TensorBoardWriter> tensorboard_;
  double start_s_ = 0;          // monotonic time the logger was created
  double interval_s_ = 0;       // step time since the last logged step
  double interval_wait_s_ = 0;  // exposed comm since the last logged step
  int64_t interval_steps_ = 0;
};

}  // namespace dtrain::engine::trainer
