// Logger set-up for every dtrain process (see log.h).
#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace dtrain::log {

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

}  // namespace dtrain::log
