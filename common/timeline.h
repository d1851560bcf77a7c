// The timeline trace (log.trace.steps): every rank records spans (data fetch,
// forward/backward per micro-batch, pipeline actions, collectives, optimizer,
// checkpoint) for a range of steps into a preallocated array of POD records
// and writes them, with its clock offset to rank 0, to
// <log.dir>/trace/rank_<r>.json when the range ends. Owns the recorder, the
// raw file and the merge into one Chrome trace; no LibTorch (the clock
// offset is measured by the engine, engine/trainer/timeline_clock.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::timeline {

enum class Kind : uint8_t {
  step, data, forward, backward, backward_input, backward_weight,
  send_act, recv_act, send_grad, recv_grad, collective, grad_sync, optimizer, checkpoint,
};
const char* kind_name(Kind kind);

// One span: steady-clock nanoseconds of this process. POD, 64 bytes.
struct Span {
  int64_t begin_ns = 0, end_ns = 0;
  int64_t wait_ns = 0;  // collectives: time blocked in the call or its wait()
  uint64_t bytes = 0;   // collectives and pipeline messages
  int32_t step = 0;     // 1-based
  int16_t micro = -1;   // micro-batch (-1: none)
  int16_t chunk = -1;   // pipeline: this rank's virtual stage (-1: none)
  Kind kind = Kind::step;
  char op[15] = {};     // collective op ("all_reduce")
  char group[8] = {};   // collective group ("dp")
};

int64_t now_ns();  // steady clock

// What a rank's file says about it (the merge labels processes with it).
struct RankInfo {
  int rank = 0, world = 1;
  std::string coords;       // "tp0 pp1 dp0"
  int pp_stage = 0;         // this rank's pipeline rank
  int chunks = 1;           // its virtual stages (names carry the chunk when > 1)
  int64_t offset_ns = 0;    // this clock minus rank 0's (subtract to align)
  int64_t rtt_ns = 0;       // the round trip of the sample the offset came from
};

struct Options {
  int from = 0, to = -1;  // steps, inclusive; from > to: off
  std::string dir;        // <log.dir>/trace
  RankInfo info;
};

// The process's recorder. start() allocates the array; until then, and
// outside [from, to], record() is one branch.
void start(const Options& options);
void set_offset(int64_t offset_ns, int64_t rtt_ns);
bool enabled();                 // a range was set (the clock offset is wanted)
// Marks step `step` (1-based) begun; recording is on while it lies in range.
void begin_step(int step);
// Ends the step's span; after the range's last step writes the file and
// returns its path ("" otherwise).
std::string end_step();
bool recording();
void record(const Span& span);
void record(Kind kind, int64_t begin_ns, int micro = -1, int chunk = -1, uint64_t bytes = 0);
void record_collective(const char* op, const std::string& group, uint64_t bytes, int64_t begin_ns,
                       int64_t wait_ns);
void stop();  // drops the recorder (tests)

// A span from construction to destruction (when recording).
class Scope {
 public:
  explicit Scope(Kind kind, int micro = -1, int chunk = -1)
      : kind_(kind), micro_(micro), chunk_(chunk), begin_(recording() ? now_ns() : 0) {}
  ~Scope() {
    if (begin_ != 0) record(kind_, begin_, micro_, chunk_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Kind kind_;
  int micro_, chunk_;
  int64_t begin_;
};

// The raw file, as written and read back.
struct RankFile {
  RankInfo info;
  int from = 0, to = 0;
  uint64_t dropped = 0;  // spans that did not fit the array
  std::vector<Span> spans;
};
std::string rank_file_path(const std::string& trace_dir, int rank);
void write_rank_file(const std::string& path, const RankFile& file);
// Throws dtrain::Error(config) naming the file when it is not a rank file.
RankFile read_rank_file(const std::string& path);

// `dtrain trace merge`: every rank_<r>.json of <log_dir>/trace into one
// Chrome-trace JSON (pid = rank, one track per kind of work, microseconds
// aligned to rank 0). Throws dtrain::Error(config) for a directory without a
// complete set of rank files.
struct MergeStats {
  int ranks = 0;
  size_t spans = 0;
  uint64_t dropped = 0;
};
std::string merge_to_chrome(const std::string& log_dir, MergeStats* stats);

}  // namespace dtrain::timeline
