// The root-cause report of a failed job: ONE block for the first worker
// that failed (host, node, rank, exit code or signal name, time, its error
// file and the last lines of its log). Formatting only; it decides nothing.
#pragma once

#include <string>

#include "launcher/worker.h"

namespace dtrain::launcher {

struct RootCause {
  std::string host;  // hostname, for people
  std::string addr;  // the address the node advertised
  std::string node_id;
  int node_rank = 0;
  int restarts_used = 0;
  int max_restarts = 0;
  Worker worker;  // the first failure (state FAILED)

  static constexpr size_t kLogLines = 10;

  // The block printed when the job fails.
  std::string to_text() const;
};

// The message in a worker's error file: torchelastic's {"message": {"message":
// ...}} or {"message": "..."} JSON (common/error_file.h), else the text
// itself (both truncated).
std::string error_file_message(const std::string& text);

// What the rendezvous tells the other nodes: "in step S: " (when the file
// gives the step) and the message.
std::string error_file_report(const std::string& text);

// When a failed worker failed, in seconds since the epoch: the time of its
// error file when it wrote one (the exception, often well before the exit:
// tearing down LibTorch and Gloo takes a while, and the peers it leaves
// fail meanwhile), else when the agent saw it exit. The earliest is the root cause.
double failure_time(const Worker& worker);

// Read a worker's error file ("" when it wrote none).
std::string read_error_file(const std::string& path);

}  // namespace dtrain::launcher
