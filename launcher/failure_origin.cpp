// failure_is_ours (failure_origin.h).
#include "launcher/failure_origin.h"

namespace dtrain::launcher {

bool failure_is_ours(const std::string& failure, const std::string& node_id, int rank) {
  const std::string head = "rank " + std::to_string(rank) + " (local rank ";
  if (failure.rfind(head, 0) != 0) return false;
  const size_t eol = failure.find('\n');
  const std::string first_line = failure.substr(0, eol);
  return first_line.find("'" + node_id + "'") != std::string::npos;
}

}  // namespace dtrain::launcher
