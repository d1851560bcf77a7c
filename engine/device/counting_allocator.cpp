// counting_allocator.h: each allocation is remembered by its data pointer
// (with the inner allocator's DataPtr and its size), so the free subtracts
// exactly what the allocation added, on whatever thread frees it.
#include "engine/device/counting_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace dtrain::engine::device {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void add(int64_t n) {
  const int64_t live = g_live.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

// Every live allocation by its data pointer. The DataPtrs handed out are
// "simple" (context == data) and raw_deleter() works, as LibTorch's raw
// allocation path requires. Leaked on purpose: tensors may be freed during
// static destruction.
struct Live {
  std::mutex mu;
  std::unordered_map<void*, std::pair<c10::DataPtr, int64_t>> by_ptr;
};
Live& live() {
  static Live* l = new Live;
  return *l;
}

void free_allocation(void* ptr) {
  std::pair<c10::DataPtr, int64_t> a;
  {
    std::lock_guard<std::mutex> lock(live().mu);
    auto it = live().by_ptr.find(ptr);
    if (it == live().by_ptr.end()) return;
    a = std::move(it->second);
    live().by_ptr.erase(it);
  }
  g_live.fetch_sub(a.second, std::memory_order_relaxed);
  // a.first frees the memory through the inner allocator's deleter here
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    if (data == nullptr) return inner;  // zero bytes: nothing to count
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(live().mu);
      live().by_ptr.emplace(data, std::make_pair(std::move(inner), static_cast<int64_t>(n)));
    }
    add(static_cast<int64_t>(n));
    return {data, data, &free_allocation, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_allocation; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* inner_;
};

std::once_flag g_once;
bool g_installed = false;

}  // namespace

void install_counting_cpu_allocator() {
  std::call_once(g_once, [] {
    static CountingAllocator counting(c10::GetCPUAllocator());
    // Priority 1: above the default CPU allocator's registration (0).
    c10::SetCPUAllocator(&counting, /*priority=*/1);
    g_installed = c10::GetCPUAllocator() == &counting;
  });
}

bool counting_cpu_allocator_installed() { return g_installed; }
int64_t cpu_live_bytes() { return g_live.load(std::memory_order_relaxed); }
int64_t cpu_peak_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_cpu_peak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace dtrain::engine::device
