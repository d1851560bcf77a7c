// Byte sizes as people write them: "80GiB", "512MiB", "1.5GB", "4096".
// Binary units (KiB..TiB, and K/M/G/T) are powers of 1024, decimal ones
// (kB..TB) powers of 1000. Pure inline parsing, nothing else.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace dtrain {

// The size in bytes, or -1 when `text` is not one.
inline int64_t parse_byte_size(const std::string& text) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(x >= 0) || !std::isfinite(x)) return -1;
  std::string unit(end);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char ch) { return std::isspace(ch); }),
             unit.end());
  for (auto& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  const double k = 1024.0;
  double mult = -1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "kib" || unit == "k") mult = k;
  else if (unit == "mib" || unit == "m") mult = k * k;
  else if (unit == "gib" || unit == "g") mult = k * k * k;
  else if (unit == "tib" || unit == "t") mult = k * k * k * k;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  if (mult < 0 || x * mult > 9.0e18) return -1;
  return int64_t(std::llround(x * mult));
}

}  // namespace dtrain
