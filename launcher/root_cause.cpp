// RootCause (see root_cause.h).
#include "launcher/root_cause.h"

#include <ctime>
#include <fstream>
#include <sstream>

#include "common/error_file.h"
#include "launcher/rank_output.h"

namespace dtrain::launcher {

namespace {

constexpr size_t kMaxMessage = 2000;

std::string format_time(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() %
            1000;
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%s.%03d", buf, static_cast<int>(ms));
  return out;
}

std::string indent(const std::string& text, const std::string& pad) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out += pad + line + "\n";
  return out;
}

}  // namespace

std::string error_file_message(const std::string& text) {
  std::string message = parse_error_file(text).message;
  if (message.size() > kMaxMessage) message = message.substr(0, kMaxMessage) + " [...]";
  return message;
}

std::string error_file_report(const std::string& text) {
  const int64_t step = parse_error_file(text).step;
  return (step > 0 ? "in step " + std::to_string(step) + ": " : "") + error_file_message(text);
}

double failure_time(const Worker& worker) {
  if (!worker.error_file_text.empty()) {
    const int64_t ms = parse_error_file(worker.error_file_text).time_ms;
    if (ms > 0) return double(ms) / 1000.0;
  }
  return std::chrono::duration<double>(worker.ended.time_since_epoch()).count();
}

std::string read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string RootCause::to_text() const {
  const std::string rule(72, '=');
  std::ostringstream out;
  out << rule << "\n"
      << "dtrain: job failed. Root cause (first failure):\n"
      << "  time       : " << format_time(worker.ended) << "\n"
      << "  host       : " << host << (addr.empty() ? "" : " (" + addr + ")") << "\n"
      << "  node       : " << node_rank << " (" << node_id << ")\n"
      << "  rank       : " << worker.rank << " (local rank " << worker.local_rank << ")\n"
      << "  exit       : " << worker.exit.describe() << "\n"
      << "  restarts   : " << restarts_used << " of " << max_restarts << " used\n";
  if (!worker.error_file_text.empty()) {
    const int64_t step = parse_error_file(worker.error_file_text).step;
    if (step > 0) out << "  step       : " << step << " (the step it failed in)\n";
    out << "  error file : " << worker.spec.error_file << "\n"
        << indent(error_file_message(worker.error_file_text), "    ");
  }
  auto lines = tail_lines(worker.spec.log_path, kLogLines);
  out << "  log        : " << worker.spec.log_path;
  if (lines.empty()) {
    out << " (empty)\n";
  } else {
    out << " (last " << lines.size() << " lines)\n";
    for (const auto& line : lines) out << "    | " << line << "\n";
  }
  out << rule << "\n";
  return out.str();
}

}  // namespace dtrain::launcher
