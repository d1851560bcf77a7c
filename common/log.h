// Thin logging front over spdlog: "[time][level][rank r/N][module] message".
// Owns the process-wide logger set-up; it does not decide what to log.
#pragma once

#include <spdlog/spdlog.h>
#include <spdlog/fmt/ostr.h>

#include <string>

namespace dtrain::log {

// Configure the default logger. rank < 0 means "not a worker" (launcher):
// the rank field is left out. Level from DTRAIN_LOG_LEVEL (info by default).
void init(const std::string& module, int rank = -1, int world = 0);

}  // namespace dtrain::log

#define DTRAIN_INFO(...) ::spdlog::info(__VA_ARGS__)
#define DTRAIN_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define DTRAIN_ERROR(...) ::spdlog::error(__VA_ARGS__)
#define DTRAIN_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
