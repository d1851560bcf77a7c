// The error file's JSON (error_file.h), written through SafeOutput so the
// agent never reads half a file.
#include "common/error_file.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/safe_output.h"

namespace dtrain {

std::string error_file_json(const ErrorFileRecord& r) {
  nlohmann::json extra = nlohmann::json::object();
  extra["timestamp"] = std::to_string(r.time_ms / 1000);
  if (r.time_ms > 0) extra["time_ms"] = r.time_ms;
  if (r.rank >= 0) extra["rank"] = r.rank;
  if (r.step >= 0) extra["step"] = r.step;
  if (!r.error_code.empty()) extra["error_code"] = r.error_code;
  nlohmann::json j;
  j["message"] = {{"message", r.message}, {"extraInfo", extra}};
  // Invalid UTF-8 in an exception text is replaced, never a reason to lose the file.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

bool write_error_file(const std::string& path, const ErrorFileRecord& record) {
  if (path.empty()) return false;
  try {
    write_file_safely(path, error_file_json(record), "DTRAIN_ERROR_FILE", Clobber::replace);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

namespace {

int64_t int_field(const nlohmann::json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key)) return -1;
  const auto& v = obj[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    try {
      return std::stoll(v.get<std::string>());
    } catch (const std::exception&) {
      return -1;
    }
  }
  return -1;
}

}  // namespace

ErrorFileRecord parse_error_file(const std::string& text) {
  ErrorFileRecord r;
  r.message = text;
  auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("message")) return r;
  const auto& m = json["message"];
  if (m.is_string()) {
    r.message = m.get<std::string>();
  } else if (m.is_object() && m.contains("message") && m["message"].is_string()) {
    r.message = m["message"].get<std::string>();
    if (m.contains("extraInfo")) {
      const auto& extra = m["extraInfo"];
      r.rank = static_cast<int>(int_field(extra, "rank"));
      r.step = int_field(extra, "step");
      r.time_ms = int_field(extra, "time_ms");
      if (extra.is_object() && extra.contains("error_code") && extra["error_code"].is_string())
        r.error_code = extra["error_code"].get<std::string>();
      if (r.time_ms <= 0) r.time_ms = std::max<int64_t>(0, int_field(extra, "timestamp") * 1000);
    }
  }
  return r;
}

}  // namespace dtrain
