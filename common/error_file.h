// A worker's error file (DTRAIN_ERROR_FILE, torchelastic's TORCHELASTIC_ERROR_FILE):
// the JSON a failing worker leaves for its agent (message, rank, step, time)
// and its parser, which also reads torchelastic's own files and plain text.
// Writing and reading only; who sets the path and who prints it live in launcher/.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain {

struct ErrorFileRecord {
  std::string message;    // what the exception said
  int rank = -1;          // RANK of the writer, -1 = not given
  int64_t step = -1;      // the training step it failed in (from 1), -1 = not given
  int64_t time_ms = 0;    // when it was written, milliseconds since the epoch; 0 = not given
  // The dtrain::Error code's name ("config", ...) when the writer failed on
  // one; "" = not given. A config error fails the same way on every restart.
  std::string error_code;
};

// torchelastic's layout, which torch.distributed.elastic's reader also
// accepts: {"message": {"message": M, "extraInfo": {"timestamp": "<seconds>",
// "time_ms": T, "rank": R, "step": S, "error_code": C}}}. The milliseconds order failures
// that happen within one second (a peer that broke on the first one).
std::string error_file_json(const ErrorFileRecord& record);

// Writes the record to `path` atomically (a temporary file beside it,
// fsynced, renamed over it). Returns false, writing nothing, when it cannot.
bool write_error_file(const std::string& path, const ErrorFileRecord& record);

// Parses an error file: the layout above, torchelastic's {"message": "..."},
// or any other text (all of it is the message; rank and step -1).
ErrorFileRecord parse_error_file(const std::string& text);

}  // namespace dtrain
