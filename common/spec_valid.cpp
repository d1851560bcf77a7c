// The job spec's validation-data rules (data.valid): one source (path,
// split or blend), split in (0, 0.5], blend weights > 0, every and batches
// >= 1, no file for synthetic data. Problems are collected like the rest of
// validate_spec; nothing throws. Whether data.valid.path's (or the blend's)
// files exist is checked at launch (launcher/input_checks.h), where they are.
#include <string>
#include <vector>

#include "common/spec_detail.h"

namespace dtrain::detail {

namespace {

// data.valid.blend: data.blend's rules (a path and a weight > 0 each), for
// files in data.format; synthetic data has none.
void validate_valid_blend(const JobSpec& s, const SpecOrigin& origin, Problems& problems) {
  const std::vector<DataSource>& blend = s.data.valid.blend;
  if (blend.empty() || origin.any_bad({"data.valid.blend", "data.format"})) return;
  const std::string where = origin.where("data.valid.blend");
  if (s.data.format == DataFormat::synthetic)
    problems.error(where, "data.valid.blend with data.format = synthetic: synthetic data has no file format to "
                          "read it in; hold out part of the synthetic stream with data.valid.split (e.g. 0.01) "
                          "instead");
  for (size_t i = 0; i < blend.size(); ++i) {
    const DataSource& src = blend[i];
    const std::string at = "data.valid.blend[" + std::to_string(i) + "]";
    if (src.path.empty())
      problems.error(where, at + ".path is empty; give a file in data.format (for indexed: the PREFIX of "
                                 "PREFIX.idx + PREFIX.bin)");
    if (!(src.weight > 0))
      problems.error(where, at + ".weight = " + format_double(src.weight) + " (" + src.path +
                                "): must be > 0; drop the source instead of weighting it 0");
  }
}

}  // namespace

void validate_valid(const JobSpec& s, const SpecOrigin& origin, Problems& problems) {
  const ValidSpec& v = s.data.valid;
  auto bad = [&](std::initializer_list<std::string> paths) { return origin.any_bad(paths); };
  auto error = [&](const std::string& path, const std::string& text) { problems.error(origin.where(path), text); };
  if (!bad({"data.valid.every"}) && v.every < 1)
    error("data.valid.every", "data.valid.every = " + std::to_string(v.every) +
                                  ": must be >= 1 (steps between evaluations; one more runs after the last step); "
                                  "e.g. 100");
  if (!bad({"data.valid.batches"}) && v.batches < 1)
    error("data.valid.batches", "data.valid.batches = " + std::to_string(v.batches) +
                                    ": must be >= 1 (the windows of model.seq_len tokens evaluated); e.g. 16");
  if (!bad({"data.valid.split"}) && (v.split < 0 || v.split > 0.5))
    error("data.valid.split", "data.valid.split = " + format_double(v.split) +
                                  ": must be in (0, 0.5] (the fraction of data.path held out for validation); "
                                  "e.g. 0.01, or leave it out");
  if (!bad({"data.valid.path", "data.valid.split"}) && !v.path.empty() && v.split > 0)
    error("data.valid.split", "data.valid.path = " + v.path + " and data.valid.split = " + format_double(v.split) +
                                  ": validation reads one source; keep the path or the split");
  if (!bad({"data.valid.path", "data.valid.split", "data.valid.blend"}) && !v.blend.empty() &&
      (!v.path.empty() || v.split > 0))
    error("data.valid.blend", std::string("data.valid.blend and data.valid.") + (v.path.empty() ? "split" : "path") +
                                  " are both given: validation reads the blend, a path or a split; keep one");
  validate_valid_blend(s, origin, problems);
  // Indexed training data draws windows over its documents shuffled per
  // epoch, so a tail of window numbers is no held-out set there.
  if (!bad({"data.valid.split", "data.format"}) && v.split > 0 && s.data.format == DataFormat::indexed)
    error("data.valid.split", "data.valid.split = " + format_double(v.split) +
                                  " with data.format = indexed: the training windows run over shuffled documents, "
                                  "so a split would not hold anything out; give a separate indexed dataset as "
                                  "data.valid.path (e.g. one `dtrain data prepare` wrote from held-out documents)");
  // Synthetic data has no file whose format a validation file could share;
  // its stream can still be split.
  if (!bad({"data.valid.path", "data.format"}) && !v.path.empty() && s.data.format == DataFormat::synthetic)
    error("data.valid.path", "data.valid.path = " + v.path +
                                 " with data.format = synthetic: synthetic data has no file format to read it in; "
                                 "hold out part of the synthetic stream with data.valid.split (e.g. 0.01) instead");
}

}  // namespace dtrain::detail
