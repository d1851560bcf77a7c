// Logger set-up and output for every dtrain process (see log.h): the only
// place that includes spdlog's headers besides benchmarks.
#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

namespace dtrain::log {

namespace {

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

void init(const std::string& module, int rank, int world) {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("dtrain", sink);
  std::string pattern = "[%H:%M:%S.%e][%^%l%$]";
  if (rank >= 0) pattern += "[rank " + std::to_string(rank) + "/" + std::to_string(world) + "]";
  pattern += "[" + module + "] %v";
  logger->set_pattern(pattern);
  const char* level = std::getenv("DTRAIN_LOG_LEVEL");
  logger->set_level(level ? spdlog::level::from_str(level) : spdlog::level::info);
  spdlog::set_default_logger(logger);
}

void set_level(Level level) { spdlog::set_level(to_spdlog(level)); }

bool enabled(Level level) { return spdlog::default_logger_raw()->should_log(to_spdlog(level)); }

void write(Level level, const std::string& message) {
  spdlog::default_logger_raw()->log(to_spdlog(level), spdlog::string_view_t(message));
}

}  // namespace dtrain::log
