// dtrain::Error: the one exception type of the project (STYLE.md "Errors").
// Owns the error codes and their exit-code mapping; it does not format or log.
#pragma once

#include <stdexcept>
#include <string>

namespace dtrain {

enum class ErrorCode {
  config,         // bad job spec or command-line input (exit 2)
  rendezvous,     // refused or failed rendezvous
  timeout,        // a deadline passed
  worker_failed,  // a worker exited non-zero and restarts are used up
  checkpoint,     // corrupt, missing or mismatched checkpoint
  internal,       // our bug
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message, std::string hint = {});

  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }
  // Exit code for apps/dtrain: config errors are 2 (like usage errors),
  // everything else 1.
  int exit_code() const;

 private:
  ErrorCode code_;
  std::string message_;
  std::string hint_;
};

}  // namespace dtrain
