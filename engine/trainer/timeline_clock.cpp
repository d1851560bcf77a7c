// start_timeline (timeline_clock.h). The offset is NTP's estimate: rank r
// sends, rank 0 answers with its steady clock, and r takes the middle of its
// round trip as the moment rank 0 read it; of a few rounds the one with the
// smallest round trip wins (its error is at most half that RTT). Ranks are
// measured one after another, so rank 0 answers one peer at a time.
#include "engine/trainer/timeline_clock.h"

#include <ATen/ops/zeros.h>

#include <climits>

#include "common/log.h"
#include "common/timeline.h"

namespace dtrain::engine::trainer {
namespace {

constexpr int kRounds = 8;
constexpr int kTag = 1;

struct Offset {
  int64_t offset_ns = 0, rtt_ns = 0;
};

Offset measure_offset(comm::Group& control) {
  const int me = control.rank();
  at::Tensor buf = at::zeros({1}, at::TensorOptions().dtype(at::kLong));  // [1] rank 0's clock
  Offset best;
  best.rtt_ns = me == 0 ? 0 : INT64_MAX;
  for (int r = 1; r < control.size(); ++r) {
    for (int k = 0; k < kRounds; ++k) {
      if (me == r) {
        const int64_t t0 = timeline::now_ns();
        control.send(buf, 0, kTag)->wait();
        control.recv(buf, 0, kTag)->wait();
        const int64_t t1 = timeline::now_ns();
        if (t1 - t0 < best.rtt_ns) best = {t0 + (t1 - t0) / 2 - buf.item<int64_t>(), t1 - t0};
      } else if (me == 0) {
        control.recv(buf, r, kTag)->wait();
        buf.fill_(timeline::now_ns());
        control.send(buf, r, kTag)->wait();
      }
    }
  }
  return best;
}

std::string coords(const comm::WorldInfo& info) {
  const auto& c = info.coord;
  std::string s = "tp" + std::to_string(c[mesh::Axis::tp]) + " pp" + std::to_string(c[mesh::Axis::pp]) + " dp" +
                  std::to_string(c[mesh::Axis::dp]);
  if (info.mesh.cp() > 1) s += " cp" + std::to_string(c[mesh::Axis::cp]);
  if (info.mesh.ep > 1) s += " ep" + std::to_string(c.ep);
  return s;
}

}  // namespace

void start_timeline(TrainSession& s) {
  const std::vector<int>& steps = s.spec.log.trace_steps;
  if (steps.size() != 2) return;  // off (the validator refused any other length)
  timeline::Options o;
  o.from = steps[0];
  o.to = steps[1];
  o.dir = (s.info.run_dir.empty() ? s.spec.log.dir : s.info.run_dir) + "/trace";
  o.info.rank = s.info.rank;
  o.info.world = s.info.world;
  o.info.coords = coords(s.info);
  o.info.pp_stage = s.info.coord[mesh::Axis::pp];
  o.info.chunks = s.spec.parallel.pipeline_virtual_stages;
  timeline::start(o);
  const Offset off = measure_offset(s.comm->control());
  timeline::set_offset(off.offset_ns, off.rtt_ns);
  if (s.is_log_rank())
    DTRAIN_INFO("log.trace: recording steps {}-{} on every rank into {}/rank_<r>.json; "
                "`dtrain trace merge` makes one Chrome trace of them", o.from, o.to, o.dir);
  else
    DTRAIN_INFO("log.trace: clock offset to rank 0 {} ns (round trip {} ns)", off.offset_ns, off.rtt_ns);
}

}  // namespace dtrain::engine::trainer
