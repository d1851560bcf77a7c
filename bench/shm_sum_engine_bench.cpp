// The symmetric-buffer all-reduce's reduction (engine/comm/shm_symmetric.cpp)
// on its own: the last rank to arrive sums the members' ranges and leaves the
// sum in every member's range. Two ways on the same regions:
//   apart: reduce_in_rank_order (at::add_out, region 0 += region j) then a
//          memcpy of region 0 into each other region (what main did);
//   fused: sum_to_all (shm_segment.h), the same adds block by block with the
//          copies of each block while it is in L1.
// Each pass walks n regions of `elems` fp32 (the compute-size GPT's gradient
// count by default: out of cache, as after a backward) in DDP-sized buckets;
// rounds interleave the two ways (order alternating), CPU time of this
// thread, median ms per pass and their ratio, for n = 2 and 4. The bits are
// checked equal after every pass.
//   build/bench/shm_sum_engine_bench [rounds=7] [elements=12900000] [bucket_elems=262144]
#include <ATen/ops/from_blob.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/comm/shm_segment.h"

namespace shm = dtrain::engine::comm::detail;

namespace {

double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Every region refilled with its own values (a backward's fresh gradients).
void fill(std::vector<std::vector<float>>& regions) {
  for (size_t j = 0; j < regions.size(); ++j)
    for (size_t i = 0; i < regions[j].size(); ++i)
      regions[j][i] = float((i * 2654435761ULL + j * 97) % 1000) * 1e-3f - 0.5f;
}

void apart(std::vector<std::vector<float>>& regions, int64_t off, int64_t len) {
  const int n = static_cast<int>(regions.size());
  auto piece = [&](int j) { return at::from_blob(regions[size_t(j)].data() + off, {len}, at::kFloat); };
  at::Tensor acc = piece(0);
  shm::reduce_in_rank_order(acc, n, piece, dtrain::engine::comm::ReduceOp::sum);
  for (int j = 1; j < n; ++j) std::memcpy(regions[size_t(j)].data() + off, regions[0].data() + off, size_t(len) * 4);
}

void fused(std::vector<std::vector<float>>& regions, int64_t off, int64_t len) {
  std::vector<char*> ranges;
  for (auto& r : regions) ranges.push_back(reinterpret_cast<char*>(r.data() + off));
  shm::sum_to_all(ranges.data(), static_cast<int>(regions.size()), len, at::kFloat);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int64_t elems = argc > 2 ? std::atoll(argv[2]) : 12900000;
  const int64_t bucket = argc > 3 ? std::atoll(argv[3]) : 262144;  // 1 MiB: bench/peer_ratio.sh's bucket_mb
  int bad = 0;
  for (int n : {2, 4}) {
    std::vector<std::vector<float>> regions(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(elems)));
    std::vector<float> want;
    std::vector<double> t_apart, t_fused;
    for (int r = 0; r < rounds; ++r) {
      for (int k = 0; k < 2; ++k) {  // the order alternates each round
        const bool use_fused = (r + k) % 2 == 1;
        fill(regions);
        const double t0 = cpu_s();
        for (int64_t off = 0; off < elems; off += bucket) {
          const int64_t len = std::min(bucket, elems - off);
          if (use_fused) fused(regions, off, len);
          else apart(regions, off, len);
        }
        (use_fused ? t_fused : t_apart).push_back(1e3 * (cpu_s() - t0));
        if (want.empty()) want = regions[0];
        for (auto& reg : regions) bad += std::memcmp(reg.data(), want.data(), want.size() * 4) != 0;
      }
    }
    std::printf("n %d, %lld fp32 per region in buckets of %lld: apart %.2f ms, fused %.2f ms per pass (medians of %d), "
                "fused/apart %.3f\n",
                n, static_cast<long long>(elems), static_cast<long long>(bucket), median(t_apart), median(t_fused),
                rounds, median(t_fused) / median(t_apart));
  }
  std::printf("regions differing from the first pass's sum: %d (must be 0)\n", bad);
  return bad == 0 ? 0 : 1;
}
