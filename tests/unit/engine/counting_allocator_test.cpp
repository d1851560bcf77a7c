// engine/device/counting_allocator: live and peak bytes follow real tensor
// allocations and frees, on this thread and on another.
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>

#include <thread>

#include "engine/device/counting_allocator.h"

#include "tests/support/torch_doctest.h"

namespace device = dtrain::engine::device;

TEST_CASE("counting CPU allocator: live and peak bytes of real tensors") {
  device::install_counting_cpu_allocator();
  REQUIRE(device::counting_cpu_allocator_installed());
  const int64_t mb = 1 << 20;
  const int64_t before = device::cpu_live_bytes();
  device::reset_cpu_peak();
  {
    at::Tensor a = at::empty({mb / 4}, at::kFloat);  // 1 MiB
    CHECK(device::cpu_live_bytes() - before >= mb);
    at::Tensor b = at::ones({mb / 2}, at::kFloat);  // 2 MiB more
    CHECK(device::cpu_live_bytes() - before >= 3 * mb);
    CHECK(device::cpu_peak_bytes() - before >= 3 * mb);
    a = at::Tensor();  // freed
    CHECK(device::cpu_live_bytes() - before < 3 * mb);
    // Freed on another thread: still counted down.
    std::thread([t = std::move(b)]() mutable { t = at::Tensor(); }).join();
  }
  CHECK(device::cpu_live_bytes() - before < mb);  // both freed (allow small stray allocations)
  CHECK(device::cpu_peak_bytes() - before >= 3 * mb);
  MESSAGE("live " << device::cpu_live_bytes() - before << " B after, peak "
                  << device::cpu_peak_bytes() - before << " B above the start");
  device::reset_cpu_peak();
  CHECK(device::cpu_peak_bytes() == device::cpu_live_bytes());
}
