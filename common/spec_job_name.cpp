// The job spec's rule for job.name: it travels in every rendezvous request,
// the lock files' line-based text and the logs, so it is short (at most
// kMaxJobName bytes), valid UTF-8 and free of control characters. Checked
// at spec load, before anything starts; problems are collected like the
// rest of validate_spec.
#include <cstdio>
#include <string>

#include "common/spec_detail.h"

namespace dtrain::detail {
namespace {

constexpr size_t kMaxJobName = 128;

// The first bytes of the name as a quoted excerpt, anything unprintable as \xNN.
std::string excerpt(const std::string& name) {
  std::string out = "\"";
  for (size_t i = 0; i < name.size() && i < 40; ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += c >= 0x20 && c < 0x7f && c != '"' && c != '\\' ? std::string(1, char(c)) : std::string(hex);
  }
  return out + (name.size() > 40 ? "...\"" : "\"");
}

// Offset of the first byte that is not part of well-formed UTF-8 (no
// overlongs, surrogates or code points past U+10FFFF), or npos.
size_t invalid_utf8_at(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return i;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; k < n; ++k) {
      const unsigned char t = static_cast<unsigned char>(s[i + k]);
      if ((t >> 6) != 0x2) return i;
      cp = (cp << 6) | (t & 0x3f);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += n;
  }
  return std::string::npos;
}

}  // namespace

void validate_job_name(const JobSpec& s, const SpecOrigin& origin, Problems& problems) {
  const std::string& name = s.job.name;
  if (origin.any_bad({"job.name"}) || name.empty()) return;  // empty: check_ranges says so
  const std::string fix = "; use a short name of letters, digits, '-', '_' or '.', e.g. name: gpt-3d";
  const std::string value = "job.name = " + excerpt(name) + " (" + std::to_string(name.size()) + " bytes)";
  if (name.size() > kMaxJobName) {
    problems.error(origin.where("job.name"), value + " is longer than " + std::to_string(kMaxJobName) + " bytes" + fix);
    return;
  }
  const size_t bad = invalid_utf8_at(name);
  if (bad != std::string::npos) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(name[bad]));
    problems.error(origin.where("job.name"), value + " is not valid UTF-8 (byte " + byte + " at offset " +
                                                 std::to_string(bad) + ")" + fix);
    return;
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      problems.error(origin.where("job.name"), value + " holds a control character at offset " +
                                                   std::to_string(i) + fix);
      return;
    }
  }
}

}  // namespace dtrain::detail
