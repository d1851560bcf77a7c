// check_index (checkpoint_index.h): an index read from disk is untrusted
// input. Before any shard is opened or any buffer sized from it, every file
// name must be a plain name in the step directory, every dtype known, every
// shape's bytes free of overflow, every slice inside its shape, and the
// shards of a tensor must hold each of its elements exactly once.
#include <algorithm>
#include <numeric>
#include <set>

#include "common/checkpoint_index.h"
#include "common/error.h"
#include "common/safetensors.h"

namespace dtrain::checkpoint {
namespace {

[[noreturn]] void fail(const std::string& source, const std::string& msg) {
  throw Error(ErrorCode::checkpoint, source + ": " + msg,
              "the index does not describe its files; it is damaged or was not written by dtrain: "
              "use another checkpoint");
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s.substr(0, 200)) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += "?";
      continue;
    }
    out += c;
  }
  return out + (s.size() > 200 ? "...\"" : "\"");
}

std::string shard_text(const Shard& s) {
  return s.file + " (key " + s.key + ", slice " + slice_to_string(s.slice) + ")";
}

int64_t volume(const std::vector<Range>& slice) {
  int64_t v = 1;
  for (const auto& r : slice) v *= r.second - r.first;  // inside a checked shape: no overflow
  return v;
}

// The region where two slices overlap; empty when they do not.
std::vector<Range> intersection(const std::vector<Range>& a, const std::vector<Range>& b) {
  std::vector<Range> in;
  for (size_t d = 0; d < a.size(); ++d) {
    Range r{std::max(a[d].first, b[d].first), std::min(a[d].second, b[d].second)};
    if (r.first >= r.second) return {};
    in.push_back(r);
  }
  return in;
}

bool overlaps(const std::vector<Range>& a, const std::vector<Range>& b) {
  return a.empty() || !intersection(a, b).empty();  // a scalar's shards all hold its one element
}

// A region no shard holds, given that they do not overlap and hold fewer
// elements than the tensor: a cell of the grid cut by every shard boundary
// (each cell lies wholly inside one shard or none). The search stops after
// kMaxChecks slice tests, returning "" (huge, scattered indexes).
std::string find_gap(const TensorEntry& t) {
  constexpr int64_t kMaxChecks = 1 << 22;
  const size_t nd = t.shape.size();
  std::vector<std::vector<int64_t>> cuts(nd);
  for (size_t d = 0; d < nd; ++d) {
    cuts[d] = {0, t.shape[d]};
    for (const auto& s : t.shards) cuts[d].insert(cuts[d].end(), {s.slice[d].first, s.slice[d].second});
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  std::vector<size_t> idx(nd, 0);
  int64_t checks = 0;
  for (;;) {
    std::vector<Range> cell(nd);
    for (size_t d = 0; d < nd; ++d) cell[d] = {cuts[d][idx[d]], cuts[d][idx[d] + 1]};
    bool held = false;
    for (const auto& s : t.shards) {
      if (++checks > kMaxChecks) return "";
      if (!intersection(cell, s.slice).empty()) {
        held = true;
        break;
      }
    }
    if (!held) return slice_to_string(cell);
    size_t d = nd;  // odometer, last dim fastest
    while (d > 0 && ++idx[d - 1] + 1 >= cuts[d - 1].size()) idx[--d] = 0;
    if (d == 0) return "";
  }
}

void check_coverage(const TensorEntry& t, int64_t numel, const std::string& source) {
  // Sorted by the start of dim 0: a shard can only overlap the ones after it
  // that start before it ends along dim 0 (row-split tensors: linear).
  std::vector<size_t> order(t.shards.size());
  std::iota(order.begin(), order.end(), 0);
  if (!t.shape.empty())
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return t.shards[a].slice[0].first < t.shards[b].slice[0].first; });
  int64_t held = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const Shard& a = t.shards[order[i]];
    if (volume(a.slice) == 0) continue;
    held += volume(a.slice);
    for (size_t j = i + 1; j < order.size(); ++j) {
      const Shard& b = t.shards[order[j]];
      if (!t.shape.empty() && b.slice[0].first >= a.slice[0].second) break;
      if (volume(b.slice) == 0 || !overlaps(a.slice, b.slice)) continue;
      fail(source, "tensor " + t.name + ": shards " + shard_text(a) + " and " + shard_text(b) +
                       " overlap in region " + slice_to_string(intersection(a.slice, b.slice)) +
                       "; each element must be in exactly one shard");
    }
  }
  if (held == numel) return;  // no overlaps, so held <= numel
  const std::string gap = find_gap(t);
  fail(source, "tensor " + t.name + " " + shape_to_string(t.shape) + ": its " +
                   std::to_string(t.shards.size()) + " shard(s) hold " + std::to_string(held) +
                   " of its " + std::to_string(numel) + " elements" +
                   (gap.empty() ? std::string() : "; region " + gap + " is in no shard"));
}

void check_tensor(const TensorEntry& t, const std::set<std::string>& files, const std::string& source) {
  uint64_t bytes = 0;
  if (!safetensors::checked_nbytes(t.shape, t.dtype, &bytes))
    fail(source, "tensor " + t.name + " is " + quoted(t.dtype) + " " + shape_to_string(t.shape) +
                     ": not a valid tensor (unknown dtype, a negative dim, or more than 2^63 bytes)");
  if (t.shards.empty()) fail(source, "tensor " + t.name + " has no shards");
  for (const auto& s : t.shards) {
    if (!files.count(s.file))
      fail(source, "tensor " + t.name + ": shard file " + quoted(s.file) +
                       " is not one of the index's \"files\"");
    for (size_t d = 0; d < s.slice.size(); ++d)
      if (s.slice[d].first < 0 || s.slice[d].first > s.slice[d].second || s.slice[d].second > t.shape[d])
        fail(source, "tensor " + t.name + " " + shape_to_string(t.shape) + ": shard " + shard_text(s) +
                         " is not inside the tensor along dim " + std::to_string(d));
  }
  check_coverage(t, safetensors::numel(t.shape), source);
}

}  // namespace

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

void check_index(const Index& index, const std::string& source) {
  std::set<std::string> files;
  for (const auto& f : index.files) {
    if (!is_plain_file_name(f))
      fail(source, "file " + quoted(f) +
                       " is not a plain file name; a checkpoint reads only files inside its own "
                       "step directory (no '/', no '..')");
    if (!files.insert(f).second) fail(source, "file " + quoted(f) + " is listed twice");
  }
  std::set<std::string> names;
  for (const auto& t : index.tensors) {
    if (!names.insert(t.name).second) fail(source, "tensor " + t.name + " is listed twice");
    check_tensor(t, files, source);
  }
}

}  // namespace dtrain::checkpoint
