// Parsing a job spec that should fail, for the spec tests: what was thrown
// (message, code, exit code) and a substring check that prints the whole
// message when the part is missing. Not a validator: common/ owns the rules.
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "common/job_spec.h"

namespace dtrain::testing {

struct SpecError {
  bool thrown = false;
  std::string message;  // "" when the spec loads
  ErrorCode code = ErrorCode::internal;
  int exit_code = 0;
};

inline SpecError parse_error(const std::string& text, const std::string& source,
                             const std::vector<std::string>& overrides = {}) {
  SpecError out;
  try {
    parse_job_spec(text, source, overrides);
  } catch (const Error& e) {
    out.thrown = true;
    out.message = e.message();
    out.code = e.code();
    out.exit_code = e.exit_code();
  }
  return out;
}

// The message of a spec error from parsing `text` ("" when it loads),
// checking that it is a config error with exit code 2.
inline std::string config_error_of(const std::string& text, const std::string& source,
                                   const std::vector<std::string>& overrides = {}) {
  const SpecError e = parse_error(text, source, overrides);
  if (e.thrown) {
    CHECK(e.code == ErrorCode::config);
    CHECK(e.exit_code == 2);
  }
  return e.message;
}

// Whether `part` is in `text`; prints both when it is not.
inline bool has(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return true;
  MESSAGE("missing '" << part << "' in: " << text);
  return false;
}

}  // namespace dtrain::testing
