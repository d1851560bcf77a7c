// gloo_shim (see ../../README.md): the base class of ProcessGroupGloo::GlooStore,
// with the four virtual functions that class overrides (GLOO_STORE_HAS_STORE_V2
// stays undefined, so it overrides no more). GlooStore objects are only ever
// constructed inside LibTorch, against its own Gloo; this declaration exists
// so the header compiles, and no vtable of it is emitted here.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo::rendezvous {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
};

}  // namespace gloo::rendezvous
