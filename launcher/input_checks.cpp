// check_data_file (input_checks.h): data.path, data.valid.path and
// data.valid.blend's files, stat(2) only; the tokens are counted
// from the file size (1 byte per token for bytes, 2 for tokens-u16, 4 for
// tokens-u32). An indexed dataset's header and sizes are checked by
// check_indexed_dataset (every blend source); all its tokens are checked by
// the engine at open.
#include "launcher/input_checks.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/indexed_format.h"

namespace dtrain::launcher {

namespace {

// One file of tokens in data.format, named `field` in messages.
void check_token_file(const JobSpec& spec, const std::string& path, const std::string& field_name,
                      const std::string& hint) {
  if (spec.data.format == DataFormat::indexed) {
    // data.path: every blend source (or its one prefix); data.valid.path: that prefix.
    if (field_name == "data.path")
      for (const DataSource& src : spec.data.indexed_sources()) check_indexed_dataset(src.path, spec.model.vocab);
    else
      check_indexed_dataset(path, spec.model.vocab);
    return;
  }
  const std::string field = field_name + " = " + path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(ErrorCode::config, field + ": " + std::strerror(errno), hint);
  if (S_ISDIR(st.st_mode))
    throw Error(ErrorCode::config, field + " is a directory, not a data file", hint);
  if (!S_ISREG(st.st_mode))
    throw Error(ErrorCode::config, field + " is not a regular file (a FIFO, socket or device)",
                hint);
  const int64_t token_bytes = spec.data.format == DataFormat::tokens_u16   ? 2
                              : spec.data.format == DataFormat::tokens_u32 ? 4
                                                                           : 1;
  const int64_t tokens = int64_t(st.st_size) / token_bytes;
  if (tokens < int64_t(spec.model.seq_len) + 1)
    throw Error(ErrorCode::config,
                field + " holds " + std::to_string(tokens) + " tokens (" + to_string(spec.data.format) +
                    "), fewer than one sample of model.seq_len + 1 = " +
                    std::to_string(spec.model.seq_len + 1),
                "use a longer file or a smaller model.seq_len");
}

}  // namespace

void check_valid_blend_files(const JobSpec& spec) {
  if (!spec.builtin_entrypoint() || spec.data.format == DataFormat::synthetic) return;
  const auto& blend = spec.data.valid.blend;
  for (size_t i = 0; i < blend.size(); ++i) {
    const std::string field = "data.valid.blend[" + std::to_string(i) + "].path";
    const std::string hint = "give " + field + " a file of tokens in data.format = " + to_string(spec.data.format) +
                             " (for indexed: a PREFIX of PREFIX.idx + PREFIX.bin), or drop the source";
    if (spec.data.format != DataFormat::indexed) {
      check_token_file(spec, blend[i].path, field, hint);
      continue;
    }
    try {
      check_indexed_dataset(blend[i].path, spec.model.vocab);
    } catch (const Error& e) {
      // Its messages name data.path, the field it usually checks.
      std::string what = e.message();
      const std::string usual = "data.path (format indexed): ";
      if (what.rfind(usual, 0) == 0) what = what.substr(usual.size());
      throw Error(ErrorCode::config, field + " = " + blend[i].path + ": " + what, e.hint().empty() ? hint : e.hint());
    }
  }
}

void check_data_file(const JobSpec& spec) {
  check_valid_blend_files(spec);
  if (!spec.builtin_entrypoint() || spec.data.format == DataFormat::synthetic) return;
  check_token_file(spec, spec.data.path, "data.path",
                   "give data.path a file of tokens (scripts/make-corpus writes one), or "
                   "use data.format: synthetic");
  if (!spec.data.valid.path.empty())
    check_token_file(spec, spec.data.valid.path, "data.valid.path",
                     "give data.valid.path a file of tokens in data.format = " + to_string(spec.data.format) +
                         ", or hold out part of data.path with data.valid.split");
}

}  // namespace dtrain::launcher
