// The engine's A/B switches: DTRAIN_<NAME>=0 in the environment turns a
// default-on fast path off (the path before it), for A/B runs; any other
// value, or none, leaves it on. Callers read it once (a function-local
// static) where the check sits on a hot path.
#pragma once

#include <cstdlib>
#include <cstring>

namespace dtrain {

inline bool switched_off(const char* env_name) {
  const char* v = std::getenv(env_name);
  return v && std::strcmp(v, "0") == 0;
}

}  // namespace dtrain
