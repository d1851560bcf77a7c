// CheckpointReader, check_compatible and merge (checkpoint_reader.h). Region
// copies walk the intersection of a shard's slice and the wanted region
// row by row: a memcpy per contiguous run of the last dim.
#include "common/checkpoint_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "common/crc32c.h"
#include "common/error.h"

namespace dtrain::checkpoint {
namespace {

[[noreturn]] void fail(const std::string& msg, const std::string& hint = {}) {
  throw Error(ErrorCode::checkpoint, msg, hint);
}

std::vector<int64_t> extents(const std::vector<Range>& r) {
  std::vector<int64_t> e;
  for (auto& x : r) e.push_back(x.second - x.first);
  return e;
}

// Copies the intersection `in` of src (covering src_r) into dst (covering dst_r).
void copy_intersection(const uint8_t* src, const std::vector<Range>& src_r, uint8_t* dst,
                       const std::vector<Range>& dst_r, const std::vector<Range>& in, size_t elem) {
  const size_t nd = in.size();
  if (nd == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  auto src_e = extents(src_r), dst_e = extents(dst_r);
  const size_t run = size_t(in[nd - 1].second - in[nd - 1].first) * elem;
  std::vector<int64_t> idx(nd);
  for (size_t d = 0; d < nd; ++d) idx[d] = in[d].first;
  while (true) {
    int64_t so = 0, doff = 0;
    for (size_t d = 0; d < nd; ++d) {
      so = so * src_e[d] + (idx[d] - src_r[d].first);
      doff = doff * dst_e[d] + (idx[d] - dst_r[d].first);
    }
    std::memcpy(dst + size_t(doff) * elem, src + size_t(so) * elem, run);
    int d = int(nd) - 2;  // odometer over all dims but the last
    for (; d >= 0; --d) {
      if (++idx[size_t(d)] < in[size_t(d)].second) break;
      idx[size_t(d)] = in[size_t(d)].first;
    }
    if (d < 0) return;
  }
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const std::string path = dir + "/" + kIndexFile;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec)))
    fail(path + " does not exist: " + dir + " is not a complete checkpoint");
  index_ = index_from_json(safetensors::read_regular(path, "checkpoint index", kMaxIndexBytes), path);
  for (const auto& f : index_.files) {
    const fs::file_status st = fs::symlink_status(dir + "/" + f, ec);
    if (fs::is_regular_file(st)) continue;
    if (fs::exists(st))
      fail(dir + "/" + f + " is " + (fs::is_symlink(st) ? "a symbolic link" : fs::is_directory(st) ? "a directory"
                                     : fs::is_fifo(st) ? "a FIFO" : "a special file") +
               ", not a regular file; it is not read",
           "a checkpoint holds regular files only; replace it with the real file (cp -L)");
    std::string held;
    int n = 0;
    for (const auto& t : index_.tensors)
      for (const auto& s : t.shards)
        if (s.file == f && n++ < 3) held += (held.empty() ? "" : ", ") + t.name;
    fail(dir + "/" + f + " is missing (the index lists it as holding " + std::to_string(n) +
             " tensors: " + held + (n > 3 ? ", ..." : "") + ")",
         "the checkpoint is incomplete; copy the file back or use another checkpoint");
  }
}

const TensorEntry& CheckpointReader::at(const std::string& name) const {
  if (const TensorEntry* t = index_.find(name)) return *t;
  fail(dir_ + "/" + kIndexFile + " has no tensor " + name);
}

safetensors::File& CheckpointReader::file(const std::string& name) {
  auto& f = files_[name];
  if (!f) f = std::make_unique<safetensors::File>(dir_ + "/" + name);
  return *f;
}

const safetensors::TensorInfo& CheckpointReader::shard_info(const TensorEntry& t, const Shard& s) {
  safetensors::File& f = file(s.file);
  const safetensors::TensorInfo* info = f.find(s.key);
  if (!info) fail(f.path() + ": tensor " + t.name + " (key " + s.key + ") is not in the file");
  if (info->dtype != t.dtype || info->shape != extents(s.slice))
    fail(f.path() + ": tensor " + t.name + " is " + info->dtype + " " + shape_to_string(info->shape) +
         " but the index says " + t.dtype + " " + shape_to_string(extents(s.slice)) + " (slice " +
         slice_to_string(s.slice) + ")");
  return *info;
}

void CheckpointReader::check_headers() {
  for (const auto& t : index_.tensors)
    for (const auto& s : t.shards) shard_info(t, s);
}

std::vector<uint8_t> CheckpointReader::read_shard(const TensorEntry& t, const Shard& s) {
  std::vector<uint8_t> buf(shard_info(t, s).nbytes());  // bounded by the file's size (safetensors::File)
  read_shard_into(t, s, buf.data());
  return buf;
}

void CheckpointReader::read_shard_into(const TensorEntry& t, const Shard& s, void* dst) {
  safetensors::File& f = file(s.file);
  const safetensors::TensorInfo& info = shard_info(t, s);
  f.read(info, dst);
  const uint32_t crc = crc32c(dst, info.nbytes());
  if (crc != s.crc32c) {
    char msg[64];
    std::snprintf(msg, sizeof msg, "checksum mismatch: crc32c %08x, index says %08x", crc, s.crc32c);
    fail(f.path() + ": tensor " + t.name + ": " + msg,
         "the file is corrupt (bit flip or partial copy); use another checkpoint");
  }
}

void CheckpointReader::read_region(const std::string& name, const std::vector<Range>& region, void* dst) {
  const TensorEntry& t = at(name);
  if (region.size() != t.shape.size())
    fail("tensor " + name + ": region " + slice_to_string(region) + " for shape " + shape_to_string(t.shape));
  const size_t elem = safetensors::dtype_size(t.dtype);
  int64_t want = 1, got = 0;
  for (auto& r : region) want *= r.second - r.first;
  for (const auto& s : t.shards) {
    std::vector<Range> in(region.size());
    bool empty = false;
    int64_t n = 1;
    for (size_t d = 0; d < region.size(); ++d) {
      in[d] = {std::max(region[d].first, s.slice[d].first), std::min(region[d].second, s.slice[d].second)};
      if (in[d].first >= in[d].second) empty = true;
      n *= in[d].second - in[d].first;
    }
    if (empty && !region.empty()) continue;
    if (!region.empty() && in == region && in == s.slice) {  // the shard is the region: read in place
      read_shard_into(t, s, dst);
      got = want;
      break;
    }
    std::vector<uint8_t> buf = read_shard(t, s);
    copy_intersection(buf.data(), s.slice, static_cast<uint8_t*>(dst), region, in, elem);
    got += region.empty() ? 1 : n;
    if (got >= want) break;  // shards do not overlap (check_index): the region is whole
  }
  if (got < want)
    fail("tensor " + name + ": the shards in " + dir_ + " cover " + std::to_string(got) + " of the " +
         std::to_string(want) + " elements of region " + slice_to_string(region));
}

std::vector<uint8_t> CheckpointReader::read_full(const std::string& name) {
  const TensorEntry& t = at(name);
  // The shards' header entries first: the buffer is sized from the index,
  // and only a tensor whose every byte is in its files may size one.
  for (const auto& s : t.shards) shard_info(t, s);
  std::vector<Range> region;
  for (int64_t d : t.shape) region.emplace_back(0, d);
  std::vector<uint8_t> buf(size_t(safetensors::numel(t.shape)) * safetensors::dtype_size(t.dtype));
  read_region(name, region, buf.data());
  return buf;
}

uint64_t CheckpointReader::verify_all() {
  uint64_t bytes = 0;
  for (const auto& t : index_.tensors)
    for (const auto& s : t.shards) bytes += read_shard(t, s).size();
  return bytes;
}

void check_compatible(const Index& index, const std::string& dir, const std::string& model,
                      const std::vector<ExpectedTensor>& expected) {
  std::vector<std::string> problems;
  if (index.model != model)
    problems.push_back("it holds model \"" + index.model + "\" but this run builds \"" + model + "\"");
  size_t more = 0;  // differences past the first 12 are counted, not listed
  for (const auto& e : expected) {
    const TensorEntry* t = index.find(e.name);
    std::string p;
    if (!t)
      p = "tensor " + e.name + " is missing";
    else if (t->shape != e.shape || t->dtype != e.dtype)
      p = "tensor " + e.name + " is " + t->dtype + " " + shape_to_string(t->shape) + " in the checkpoint but " +
          e.dtype + " " + shape_to_string(e.shape) + " in the model";
    if (p.empty()) continue;
    if (problems.size() < 12)
      problems.push_back(p);
    else
      ++more;
  }
  if (problems.empty()) return;
  std::string msg = dir + "/" + kIndexFile + " does not match this run's model:";
  for (auto& p : problems) msg += "\n  " + p;
  if (more) msg += "\n  ... and " + std::to_string(more) + " more tensor differences";
  fail(msg, "resume with the spec the checkpoint was saved with (dtrain resume uses it), "
            "or point checkpoint.dir elsewhere");
}

MergeStats merge(const std::string& dir, const std::string& out_path, bool with_optimizer) {
  CheckpointReader reader(dir);
  reader.check_headers();  // every tensor's bytes are in the files before any is read
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<safetensors::TensorView> views;
  MergeStats stats;
  auto take = [&](const TensorEntry& t, const std::string& out_name) {
    buffers.push_back(reader.read_full(t.name));
    views.push_back({out_name, t.dtype, t.shape, buffers.back().data()});
    ++stats.tensors;
    stats.bytes += buffers.back().size();
  };
  buffers.reserve(reader.index().tensors.size());
  for (const auto& t : reader.index().tensors)
    if (t.name.rfind("model/", 0) == 0) take(t, t.name.substr(6));
  if (with_optimizer)
    for (const auto& t : reader.index().tensors)
      if (t.name.rfind("optim/", 0) == 0) {
        std::string n = t.name;
        std::replace(n.begin(), n.end(), '/', '.');
        take(t, n);
      }
  std::map<std::string, std::string> meta = {{"format", "pt"},
                                             {"dtrain.step", std::to_string(reader.index().step)},
                                             {"dtrain.mesh", reader.index().mesh},
                                             {"dtrain.model", reader.index().model}};
  if (with_optimizer) meta["dtrain.optimizer_step"] = std::to_string(reader.index().optimizer_step);
  safetensors::write_file(out_path, views, meta);
  return stats;
}

}  // namespace dtrain::checkpoint
