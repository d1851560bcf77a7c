// A world of n ranks as threads in one process, each with its own Comm over
// one in-memory c10d store: for unit tests of collectives and of code built
// on them. Not for timing, and not the real launcher (tests/integration).
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/comm.h"
#include "tests/support/torch_doctest.h"  // after the torch headers (glog's CHECK)

namespace dtrain::testing {

using ConfigureRank =
    std::function<void(engine::comm::WorldInfo&, engine::comm::CommOptions&)>;

// Runs fn(comm, rank) on shape.world() threads; each rank's exception is
// reported as a failed check naming the rank, after all threads joined.
inline void run_world(const mesh::Mesh& shape, const std::function<void(engine::comm::Comm&, int)>& fn,
                      const ConfigureRank& configure = {}) {
  const int n = shape.world();
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        engine::comm::WorldInfo info;
        info.rank = r;
        info.world = n;
        info.mesh = shape;
        info.coord = mesh::coord_of(shape, r);
        engine::comm::CommOptions options;
        options.timeout_s = 60;
        if (configure) configure(info, options);
        auto c = engine::comm::init_comm_with_store(info, store, options);
        fn(*c, r);
        c->world().barrier();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    CHECK_MESSAGE(errors[static_cast<size_t>(r)].empty(), "rank ", r, ": ", errors[static_cast<size_t>(r)]);
}

}  // namespace dtrain::testing
