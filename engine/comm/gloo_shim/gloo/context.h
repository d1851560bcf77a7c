// gloo_shim (see ../README.md): ProcessGroupGloo.hpp holds contexts by
// shared_ptr and names setTimeout in an inline virtual function whose body is
// emitted only with ProcessGroupGloo's vtable, inside LibTorch.
#pragma once

#include <chrono>

namespace gloo {

class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

}  // namespace gloo
