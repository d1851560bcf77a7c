// Thin logging front: "[time][level][rank r/N][module] message". Owns the
// process-wide logger set-up (spdlog, in log.cpp); it does not decide what to
// log. Callers format with the fmt their headers bring (Debian's fmt in the
// launcher, LibTorch's bundled fmt in the engine, which is header-only there)
// and hand a finished string to log.cpp, so spdlog's fmt never meets another
// fmt in one translation unit.
#pragma once

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <string>

namespace dtrain::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

// Configure the default logger. rank < 0 means "not a worker" (launcher):
// the rank field is left out. Level from DTRAIN_LOG_LEVEL (info by default).
void init(const std::string& module, int rank = -1, int world = 0);

// Messages below `level` are dropped (before formatting, by the macros).
void set_level(Level level);
bool enabled(Level level);
void write(Level level, const std::string& message);

}  // namespace dtrain::log

#define DTRAIN_LOG_AT(lvl, ...)                                         \
  do {                                                                  \
    if (::dtrain::log::enabled(lvl))                                    \
      ::dtrain::log::write(lvl, ::fmt::format(__VA_ARGS__));            \
  } while (0)
#define DTRAIN_INFO(...) DTRAIN_LOG_AT(::dtrain::log::Level::info, __VA_ARGS__)
#define DTRAIN_WARN(...) DTRAIN_LOG_AT(::dtrain::log::Level::warn, __VA_ARGS__)
#define DTRAIN_ERROR(...) DTRAIN_LOG_AT(::dtrain::log::Level::error, __VA_ARGS__)
#define DTRAIN_DEBUG(...) DTRAIN_LOG_AT(::dtrain::log::Level::debug, __VA_ARGS__)
