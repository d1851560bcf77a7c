// The job spec (docs/ARCHITECTURE.md, 'The job spec'): plain structs with defaults that
// run on one machine, plus loading (YAML + --set overrides), validation and printing.
// Owns the spec's shape and rules; it does not know about ranks or processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/mesh.h"
#include "common/spec_enums.h"

namespace dtrain {

struct JobSection {
  std::string name = "dtrain";
  uint64_t seed = 1234;
};

struct RendezvousSpec {
  std::string endpoint = "127.0.0.1:29400";  // host:port of the rendezvous server
  int join_timeout_s = 60;                     // how long an agent waits for a round
  double last_call_s = 5.0;                    // elastic: wait after min nodes joined
  double heartbeat_s = 2.0;                    // agent heartbeat interval; 3 missed = dead
  double rejoin_timeout_s = 300;               // an agent that lost the rendezvous retries this long (0 = give up)
  std::string token_file;                      // file holding the shared token (or DTRAIN_TOKEN)
  std::string advertise_addr;                  // this node's address for the others ("" = the route's)
  // tls: {ca, cert, key}: PEM files (all three or none). None: the TLS
  // certificate is derived from the token. Given: the server presents cert,
  // every agent its own cert, each checked against ca (mutual TLS).
  std::string tls_ca, tls_cert, tls_key;
};

struct TopologySpec {
  int nvlink_domain = 0;  // devices per NVLink island; 0 = whole node (or discovered)
  bool allow_slow = false;  // accept TP groups that cross islands (warned, not refused)
};

struct ClusterSpec {
  int nodes_min = 1;  // "nodes: 2" -> min = max = 2; "nodes: 1:4" elastic
  int nodes_max = 1;
  int procs_per_node = 1;
  DeviceKind device = DeviceKind::cpu;             // cpu | cuda
  CommBackend backend = CommBackend::automatic;  // auto | gloo | nccl
  // Gloo groups whose ranks share a machine all-reduce through shared
  // memory, and pipeline stages on one machine send and receive through it
  // (false: over Gloo's TCP, as PyTorch does).
  bool shm = true;
  // Gloo groups that span nodes with several ranks on a node sum in shared
  // memory per node and over Gloo between node leaders (needs shm).
  bool hier_allreduce = true;
  // Gloo's reduce-scatter (ZeRO, sequence parallelism): ring = dtrain's
  // ring over Gloo send/recv; native = Gloo's own (PyTorch's).
  GlooReduceScatter gloo_reduce_scatter = GlooReduceScatter::ring;
  int max_restarts = 0;
  // A job that can restart keeps an idle LibTorch-loaded worker per local
  // rank for the next restart (~190 MB each on CPU; false: none).
  bool warm_spares = true;
  // On a round change the surviving workers keep their processes: the agent
  // sends them the new round's environment (builtin engine only; false: the
  // survivors' workers are stopped and new ones start, the restart path;
  // docs/ARCHITECTURE.md, Recovery in place).
  bool recover_in_place = true;
  // With recover_in_place, a round change takes the model and optimizer
  // state from the surviving workers' memory as they left it (no step
  // redone, nothing read) where every rank holds the whole state (pure data
  // parallel, CPU); false: from the in-memory copies or disk, as a new
  // worker would (engine/checkpoint/live_state.h).
  bool live_recovery = true;
  double grace_s = 5.0;          // SIGTERM -> SIGKILL grace period when stopping workers
  double hang_timeout_s = 0;     // no rank completes a collective this long: a hang (0 = off)
  // > 0: a hang already after this many of the slowest rank's last step (at
  // least 4 heartbeats, at most hang_timeout_s; not while a rank saves).
  double hang_timeout_steps = 0;
  // Memory one rank may use ("80GiB", "512MiB", bytes); empty = unchecked.
  // A spec whose predicted peak (`dtrain plan`) exceeds it is refused.
  std::string memory_per_rank;
  RendezvousSpec rendezvous;
  TopologySpec topology;
};

struct ParallelSpec {
  int dp = 1;
  // dp: auto = world / (tp x pp): from cluster.nodes x procs_per_node when the
  // spec loads, and again from the nodes of each rendezvous round.
  bool dp_auto = false;
  int tp = 1;
  int pp = 1;
  int ep = 1;
  // Context parallelism: the sequence split over cp ranks (two chunks each,
  // load-balanced for the causal mask), attention as a ring over them.
  int cp = 1;
  // The rank order, innermost first (common/mesh.h): every axis once.
  std::string order = "tp-cp-dp-pp";
  int zero = 0;                            // 0 = DDP, 1, 2, 3 (= FSDP full shard)
  PipelineSchedule pipeline_schedule = PipelineSchedule::one_f_one_b;  // gpipe | 1f1b | interleaved_1f1b | zb_h1
  int pipeline_virtual_stages = 1;         // chunks per pp rank (interleaved_1f1b)
  // Blocks per pipeline stage, one entry per global stage (pp x virtual_stages,
  // stage s = chunk * pp + rank); empty: model.layers split evenly.
  std::vector<int> pipeline_layers_per_stage;
  double ddp_bucket_mb = 25.0;
  bool ddp_overlap = true;
  // ZeRO-3 (FSDP): free a unit's gathered parameters after its forward
  // (false: keep them until its backward, ZeRO-2's memory for less traffic).
  bool fsdp_reshard_after_forward = true;
  bool fsdp_prefetch = true;  // gather the next unit while this one computes
  // dp ranks on one machine (CPU, shared memory): the parameters in one
  // segment they all map instead of gathered per unit.
  bool fsdp_shared_params = true;
  // Megatron sequence parallelism (tp > 1): LayerNorm/dropout regions split along T.
  bool sequence_parallel = false;
  // The dtype gradients are reduced in over dp (bf16 halves the traffic; the
  // optimizer still sees fp32 gradients).
  ReduceDtype reduce_dtype = ReduceDtype::fp32;  // fp32 | bf16
};

// Mixture of experts: the MLP of every `every`-th block (blocks 0, every,
// 2 * every, ...) becomes `experts` expert MLPs and a softmax router that
// sends each token to its top_k experts, each taking at most
// ceil(tokens * top_k * capacity_factor / experts) tokens of a micro-batch.
// balance aux: the Switch Transformer loss (aux_loss_coef); bias: also the
// DeepSeek-V3 selection bias moved by bias_rate toward the mean load.
struct MoeSpec {
  int experts = 0;  // 0 = dense
  int top_k = 1;
  double capacity_factor = 1.25;
  double aux_loss_coef = 0.01;
  int every = 1;
  MoeBalance balance = MoeBalance::aux;  // aux | bias
  double bias_rate = 0.001;     // balance bias: the step of the bias per optimizer step
  int d_ff = 0;                 // an expert MLP's hidden width; 0 = 4 * d_model (the dense MLP's)
};

struct ModelSpec {
  std::string kind = "gpt";
  int vocab = 256;
  int layers = 2;
  int d_model = 64;
  int heads = 4;
  int seq_len = 64;
  double dropout = 0.0;
  // Under tensor parallelism: the embedding and the head split by vocab rows
  // (parallel, with a vocab-parallel cross-entropy) or whole on every rank.
  TpVocab tp_vocab = TpVocab::parallel;
  MoeSpec moe;
  // The attention core: naive (the [T, T] scores materialised) or tiled
  // (FlashAttention: O(T x d) memory, scores recomputed per tile in backward).
  AttentionImpl attention = AttentionImpl::naive;
  // model.kind llama (Llama 2/3, Mistral, Mixtral): RMSNorm, rotary
  // positions, SwiGLU MLP, grouped-query attention, no biases. Unused by gpt.
  int kv_heads = 0;           // key/value heads; 0 = heads (plain multi-head)
  int ffn_hidden = 0;         // the SwiGLU MLP's hidden width; 0 = 4 * d_model
  double norm_eps = 1e-5;     // RMSNorm's epsilon (HF rms_norm_eps)
  double rope_theta = 10000;  // rotary base (HF rope_theta)
  // Llama 3.1's rotary frequency scaling; factor 0 = none.
  struct RopeScaling {
    double factor = 0;
    double low_freq_factor = 1;
    double high_freq_factor = 4;
    int original_max_position = 8192;
  } rope_scaling;
  bool tie_embeddings = false;  // the head reuses wte's weight (HF tie_word_embeddings)
  int effective_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int effective_ffn_hidden() const { return ffn_hidden > 0 ? ffn_hidden : 4 * d_model; }
};

// Where AdamW's state (optimizer) and ZeRO-3's parameter shards (params)
// live between uses: none = on the device; host = pinned host memory, the
// update on the CPU (needs a GPU); nvme = one file per rank under `path`
// (created and removed by the job), read and written in buckets by an I/O
// thread, `prefetch` reading ahead (params: nvme only, ZeRO-3 on the CPU,
// shards read back before each all-gather). Checkpoints are the same with or without.
struct OffloadSpec {
  OffloadTarget optimizer = OffloadTarget::none;
  OffloadTarget params = OffloadTarget::none;
  std::string path;  // a directory, outside checkpoint.dir; required by nvme
  bool prefetch = true;
  double bucket_mb = 64;  // AdamW state (m and v) per I/O bucket; three buckets are in memory
  bool active() const { return optimizer != OffloadTarget::none || params != OffloadTarget::none; }
};

struct TrainSpec {
  int steps = 100;
  int micro_batch = 8;
  int grad_accum = 1;
  // grad_accum: auto = global_batch / (micro_batch x dp), resolved like dp.
  bool grad_accum_auto = false;
  int global_batch = 0;  // sequences per step; 0 = whatever micro_batch x grad_accum x dp give
  double lr = 3.0e-4;
  double min_lr = 0.0;     // cosine decays to this
  int warmup_steps = 10;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;  // AdamW's epsilon (torch.optim.AdamW's eps)
  double grad_clip = 1.0;  // 0 = off
  Precision precision = Precision::fp32;  // fp32 | bf16 | fp16
  // Activation checkpointing: none; full (each block keeps only its input
  // and recomputes its forward in backward); selective (only the attention
  // core: scores, softmax, dropout).
  Recompute recompute = Recompute::none;
  // A step whose gradient norm (or logged loss) is not finite updates nothing,
  // on every rank, and no checkpoint is written after it. stop: the run stops
  // (exit 2) after nonfinite_patience such steps in a row; skip_step: training
  // goes on past any number of them (a warning each).
  NonfiniteAction nonfinite = NonfiniteAction::stop;  // stop | skip_step
  int nonfinite_patience = 3;
  // Start from these weights (a Hugging Face Llama/Mixtral directory, or a
  // dtrain checkpoint: a step_<N> dir or a checkpoint.dir) at step 0, with a
  // fresh optimizer and sampler; ignored when the run resumes. "" = random init.
  std::string init_from;
  OffloadSpec offload;
};

// One source of data.blend: a Megatron indexed dataset PREFIX and its share.
struct DataSource {
  std::string path;
  double weight = 0;
};

// Validation data (data.valid): windows of seq_len + 1 tokens, read in order
// (window i = tokens [i*T, i*T+T+1)), from `path` (same data.format as
// data.path), with `split` from the last fraction of data.path's windows
// (which the training sampler then never draws), or from `blend`: files in
// data.format drawn by share with data.blend's rule, position p of the first
// `batches` going to window n of source j when it is source j's n-th draw.
// One of the three. Evaluated every `every` steps and after the last
// (val_loss, val_ppl, eval_ms, and with a blend val_loss_by_source in
// metrics.jsonl); `dtrain eval` reads the same.
struct ValidSpec {
  std::string path;   // "" = none
  double split = 0;   // (0, 0.5]: held out of data.path; 0 = none
  std::vector<DataSource> blend;  // [] = none; weights normalised like data.blend's
  int every = 100;    // steps between evaluations
  int batches = 16;   // windows evaluated (the first ones of the source, or of the blend)
  bool active() const { return !path.empty() || split > 0 || !blend.empty(); }
};

struct DataSpec {
  std::string path = "data/corpus.txt";  // for indexed: PREFIX of PREFIX.idx + PREFIX.bin
  DataFormat format = DataFormat::bytes;  // bytes | tokens-u16 | tokens-u32 | indexed (Megatron) | synthetic
  // Indexed sources drawn by share (weights normalised; Megatron's rule: the
  // next sample from the source furthest behind its share). Non-empty
  // replaces data.path and needs data.format indexed.
  std::vector<DataSource> blend;
  // The indexed sources of the training data: blend, else {path, 1}.
  std::vector<DataSource> indexed_sources() const {
    return blend.empty() ? std::vector<DataSource>{{path, 1.0}} : blend;
  }
  ValidSpec valid;
};

struct CheckpointSpec {
  std::string dir;  // empty = no checkpoints
  int every = 0;    // 0 = only at the end / on preemption
  int keep = 3;
  // true: a save copies the state to host memory and a background thread
  // writes the files while training goes on; the commit (index.json,
  // rename, latest) follows at the first step boundary after every rank's
  // write has finished. Same files as a synchronous save.
  bool async = false;
  // In-memory copies (checkpoint.memory): every memory_every steps each rank
  // keeps its state (the entries a checkpoint holds) in its node's RAM
  // (/dev/shm, owned by its agent) and sends a copy to a rank on each of the
  // next memory_replicas nodes; a re-formed round restores the newest step
  // every shard of which survived, before disk. 0 = off.
  int memory_every = 0;
  int memory_replicas = 1;
  // Copies are kept only where another node can hold them.
  bool memory_on(int nodes) const { return memory_every > 0 && memory_replicas > 0 && nodes > 1; }
};

// Chaos testing: one fault injected on purpose, on the first launch only
// (DTRAIN_RESTART = 0), announced by a warning on every rank. Steps count
// from 1, as in metrics.jsonl. Kinds:
//   kill_after_step    rank `rank` SIGKILLs itself after step `step` (and its
//                      checkpoint, if one was due)
//   hang               rank `rank` sleeps forever after step `step` (and its
//                      checkpoint): the others wait in their next collective
//                      until the launcher is told to stop
//   slow               rank `rank` sleeps `ms` milliseconds inside every step
//                      from step `step` on (a straggler)
//   raise              rank `rank` throws an exception inside step `step`: the
//                      worker's error file and the root-cause block name it
//   crash_during_save  rank `rank` SIGKILLs itself halfway through writing its
//                      shard of the checkpoint of step `step` (0: the first save)
//   no_grad_sync       every dp rank trains on its own gradient (the gradient
//                      reductions do nothing, gathers still run): a wrong layout on purpose
//   recompute_redraw   activation recomputation draws its dropout masks from
//                      the next step's stream: a wrong recompute on purpose
//   nan_grad           rank `rank` scales its loss by NaN in the backward of
//                      step `step`: NaN gradients, as from a bad batch
//   no_tp_reduce       (every rank) the row-parallel layers skip their
//                      all-reduce over tp: each TP rank keeps its partial sum
//   no_pp_grad         (every rank) the gradient a pipeline stage sends back
//                      to the previous stage is zeros
//   reset_moments_on_load  (every rank) loading a checkpoint (resume, any
//                      layout) sets AdamW's moments to zero
//   cp_local_attention (every rank) under context parallelism each rank
//                      attends only to its own chunks: no ring
//   offload_no_writeback (every rank) train.offload's nvme files are never
//                      written back: moments from zeros, parameters unchanged
//   offload_truncate, offload_delete  rank `rank` truncates (to half) or
//                      deletes its train.offload files after step `step`
struct FaultSpec {
  FaultKind kind = FaultKind::none;
  int rank = 0;
  int step = 0;
  int ms = 0;  // slow only: the delay added to each step
  bool active() const { return kind != FaultKind::none; }
  // The kinds that act on every rank (fault.rank does not apply).
  bool every_rank() const {
    return kind == FaultKind::no_grad_sync || kind == FaultKind::no_tp_reduce || kind == FaultKind::no_pp_grad ||
           kind == FaultKind::reset_moments_on_load || kind == FaultKind::cp_local_attention ||
           kind == FaultKind::offload_no_writeback;
  }
};

struct LogSpec {
  std::string dir = "runs/dtrain";
  int every = 10;
  bool tensorboard = true;  // rank 0 also writes TensorBoard event files to <dir>/tb
  // Every rank times a matmul of the start-up probe's size after every
  // step (two, the second timed: about 4 ms at n 512, outside step_time_s);
  // each logged record gains peak_flops_live (the interval's mean rate of
  // those, summed as the start-up peak is) and mfu_live against it. On a
  // shared host the cores' speed moves within seconds, and the start-up
  // figure alone can sit far from what they gave the logged steps.
  // cluster.device cpu only.
  bool live_peak = false;
  // log.trace.steps: [FROM, TO] (inclusive, 1-based): every rank records a
  // timeline of those steps into <dir>/trace/ (`dtrain trace merge`); empty = off.
  std::vector<int> trace_steps;
};

struct JobSpec {
  JobSection job;
  ClusterSpec cluster;
  ParallelSpec parallel;
  ModelSpec model;
  TrainSpec train;
  DataSpec data;
  CheckpointSpec checkpoint;
  LogSpec log;
  FaultSpec fault;
  std::vector<std::string> entrypoint = {"builtin"};  // or any command

  std::string source;  // file the spec came from ("" for built-in defaults)

  // Derived values (docs/ARCHITECTURE.md, 'The job spec').
  int world() const { return parallel.dp * parallel.tp * parallel.pp * parallel.cp; }
  // The mesh of parallel.* (order parsed; call on a validated spec).
  mesh::Mesh mesh() const;
  int global_batch() const { return train.micro_batch * train.grad_accum * parallel.dp; }
  int ranks_per_node() const { return cluster.procs_per_node; }
  long long tokens_per_step() const { return 1LL * global_batch() * model.seq_len; }
  // Blocks of each global pipeline stage (pp x virtual_stages entries):
  // parallel.pipeline.layers_per_stage when given, else layers split evenly.
  std::vector<int> stage_layers() const;
  bool builtin_entrypoint() const {
    return entrypoint.size() == 1 && entrypoint[0] == "builtin";
  }
};

// Load a spec from a YAML file and apply "key.path=value" overrides (value read
// as YAML). Validates everything and throws dtrain::Error(config) listing every
// problem as "file:line:col: field = value ...; fix" when anything is wrong.
// Non-fatal warnings are appended to *warnings when given.
JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides = {},
                      std::vector<std::string>* warnings = nullptr);

// Same from YAML text (source names it in messages).
JobSpec parse_job_spec(const std::string& yaml_text, const std::string& source,
                       const std::vector<std::string>& overrides = {},
                       std::vector<std::string>* warnings = nullptr);

// Check a spec built or changed in code (e.g. a command-line flag applied after
// loading): the same rules as load_job_spec, messages name spec.source and the
// field instead of a line. Throws dtrain::Error(config) listing every problem.
void validate_job_spec(const JobSpec& spec, std::vector<std::string>* warnings = nullptr);

// The resolved spec, every field, as YAML (re-loadable by load_job_spec) or JSON.
std::string job_spec_to_yaml(const JobSpec& spec);
std::string job_spec_to_json(const JobSpec& spec);

// One human line per derived value: world, GBS, ranks per node, tokens per step.
std::string job_spec_summary(const JobSpec& spec);

}  // namespace dtrain
