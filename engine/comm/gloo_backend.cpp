// make_gloo_backend (gloo_backend.h): the one translation unit that includes
// ProcessGroupGloo.hpp, compiled with gloo_shim/ on its include path and
// USE_C10D_GLOO defined. It calls only LibTorch's exported functions (the
// device factories, Options::create, the constructor); no Gloo object is made
// or touched here, so the shim's declarations never meet Gloo's code.
#include "engine/comm/gloo_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>

namespace dtrain::engine::comm::detail {

GlooDevice make_gloo_device(const std::string& master_addr, const std::string& ifname) {
  std::shared_ptr<::gloo::transport::Device> device;
  if (!ifname.empty())
    device = c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  else if (master_addr.rfind("127.", 0) == 0 || master_addr == "localhost")
    device = c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  else
    device = c10d::ProcessGroupGloo::createDefaultDevice();
  return device;  // shared_ptr<void> keeps LibTorch's deleter
}

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size, double timeout_s,
                                                    int threads, const GlooDevice& device) {
  auto opts = c10d::ProcessGroupGloo::Options::create(
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  opts->devices = {std::static_pointer_cast<::gloo::transport::Device>(device)};
  opts->threads = threads;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

}  // namespace dtrain::engine::comm::detail
