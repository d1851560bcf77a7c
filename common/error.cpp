// Implementation of dtrain::Error (see error.h).
#include "common/error.h"

namespace dtrain {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::config: return "config";
    case ErrorCode::rendezvous: return "rendezvous";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::worker_failed: return "worker_failed";
    case ErrorCode::checkpoint: return "checkpoint";
    case ErrorCode::internal: return "internal";
  }
  return "unknown";
}

static std::string compose(const std::string& message, const std::string& hint) {
  return hint.empty() ? message : message + "\n  hint: " + hint;
}

Error::Error(ErrorCode code, std::string message, std::string hint)
    : std::runtime_error(compose(message, hint)),
      code_(code),
      message_(std::move(message)),
      hint_(std::move(hint)) {}

int Error::exit_code() const { return code_ == ErrorCode::config ? 2 : 1; }

}  // namespace dtrain
