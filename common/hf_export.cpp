// Hugging Face export (hf_io.h): the checkpoint's spec gives the model, the
// reader assembles each global parameter from whatever shards the mesh it
// was saved at produced, and its HF pieces stream into model.safetensors (or
// model-0000i-of-0000N.safetensors and the index transformers writes past
// the shard size), all inside a temporary directory renamed into place.
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_reader.h"
#include "common/error.h"
#include "common/hf_io.h"
#include "common/hf_llama.h"
#include "common/hf_source.h"
#include "common/safetensors_stream.h"

namespace dtrain::hf {
namespace fs = std::filesystem;
namespace ck = dtrain::checkpoint;

namespace {

// One output file and the HF tensors it holds (indices into the piece list).
struct OutFile {
  std::string name;
  std::vector<size_t> pieces;
  uint64_t bytes = 0;
};

struct PieceRef {
  const LlamaParam* param;
  const HfPiece* piece;
  uint64_t out_bytes;
};

// transformers' split: a file closes when the next tensor would take it
// past max_bytes (a tensor larger than that gets a file of its own).
std::vector<OutFile> plan_files(const std::vector<PieceRef>& pieces, uint64_t max_bytes) {
  std::vector<OutFile> files(1);
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!files.back().pieces.empty() && files.back().bytes + pieces[i].out_bytes > max_bytes) files.emplace_back();
    files.back().pieces.push_back(i);
    files.back().bytes += pieces[i].out_bytes;
  }
  char buf[64];
  for (size_t f = 0; f < files.size(); ++f) {
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", f + 1, files.size());
    files[f].name = files.size() == 1 ? "model.safetensors" : buf;
  }
  return files;
}

// The piece's bytes out of the parameter's full fp32 tensor, row-major.
void gather_piece(const std::vector<float>& full, const std::vector<int64_t>& shape, const HfPiece& piece,
                  std::vector<float>& out) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  out.clear();
  const size_t last = shape.size() - 1;
  std::vector<int64_t> idx;
  for (const auto& r : piece.region) idx.push_back(r.first);
  const int64_t run = piece.region[last].second - piece.region[last].first;
  for (;;) {
    int64_t off = 0;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * stride[d];
    out.insert(out.end(), full.begin() + off, full.begin() + off + run);
    size_t d = last;
    for (;;) {  // next row: odometer over all dims but the last
      if (d == 0) return;
      --d;
      if (++idx[d] < piece.region[d].second) break;
      idx[d] = piece.region[d].first;
    }
  }
}

std::string check_export_target(const std::string& out_dir) {
  std::error_code ec;
  const auto st = fs::symlink_status(out_dir, ec);
  if (!ec && fs::exists(st))
    throw Error(ErrorCode::config, "OUT_DIR = " + out_dir + " already exists; export never writes over anything",
                "name a directory that does not exist yet");
  const fs::path parent = fs::absolute(out_dir).parent_path();
  if (!fs::is_directory(parent, ec))
    throw Error(ErrorCode::config, "OUT_DIR = " + out_dir + ": its parent " + parent.string() + " is not a directory",
                "create the parent first");
  return parent.string();
}

void write_text(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  if (!ok) throw Error(ErrorCode::checkpoint, "cannot write " + path + ": " + std::strerror(errno));
}

// Writes every file into `tmp`.
ExportStats write_files(ck::CheckpointReader& reader, const JobSpec& spec, const std::string& tmp,
                        const ExportOptions& o) {
  const bool bf16 = o.dtype == "bf16";
  const std::vector<LlamaParam> params = llama_params(spec.model);
  std::vector<PieceRef> pieces;
  for (const auto& p : params)
    for (const auto& piece : p.pieces)
      pieces.push_back({&p, &piece, uint64_t(safetensors::numel(piece.shape)) * (bf16 ? 2 : 4)});
  const std::vector<OutFile> files = plan_files(pieces, o.max_shard_bytes);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  ExportStats stats;
  const LlamaParam* loaded = nullptr;  // the parameter `full` holds
  std::vector<float> full, part;
  std::vector<uint16_t> half;
  for (const auto& f : files) {
    std::vector<safetensors::TensorSpec> specs;
    for (size_t i : f.pieces) specs.push_back({pieces[i].piece->name, bf16 ? "BF16" : "F32", pieces[i].piece->shape});
    safetensors::StreamWriter out(tmp + "/" + f.name, specs, {{"format", "pt"}});
    for (size_t i : f.pieces) {
      const PieceRef& r = pieces[i];
      if (loaded != r.param) {  // each parameter is read once, for all its pieces
        full.resize(size_t(safetensors::numel(r.param->shape)));
        std::vector<ck::Range> all;
        for (int64_t d : r.param->shape) all.emplace_back(0, d);
        reader.read_region("model/" + r.param->name, all, full.data());
        loaded = r.param;
      }
      gather_piece(full, r.param->shape, *r.piece, part);
      if (bf16) {
        half.resize(part.size());
        to_bf16(part.data(), half.data(), part.size());
        out.append(half.data(), half.size() * 2);
      } else {
        out.append(part.data(), part.size() * 4);
      }
      weight_map[r.piece->name] = f.name;
      ++stats.tensors;
    }
    out.finish({{"format", "pt"}});
    stats.bytes += f.bytes;
  }
  stats.files = int(files.size());
  if (files.size() > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", stats.bytes}}}, {"weight_map", weight_map}};
    write_text(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  write_text(tmp + "/config.json", config_from_model(spec.model, bf16 ? "bfloat16" : "float32"));
  return stats;
}

}  // namespace

ExportStats export_checkpoint(const std::string& path, const std::string& out_dir, const ExportOptions& o) {
  if (o.dtype != "fp32" && o.dtype != "bf16")
    throw Error(ErrorCode::config, "--dtype " + o.dtype + " is not supported; use fp32 or bf16");
  const std::string dir = ck::resolve(path);
  ck::check_outside(out_dir, "OUT_DIR", path, dir);
  const std::string parent = check_export_target(out_dir);
  ck::CheckpointReader reader(dir);
  const JobSpec spec = parse_job_spec(reader.index().spec_yaml, dir + "/index.json (its spec)");
  std::vector<ck::ExpectedTensor> expected;
  for (const auto& p : llama_params(spec.model)) expected.push_back({"model/" + p.name, "F32", p.shape});
  ck::check_compatible(reader.index(), dir, reader.index().model, expected);
  reader.check_headers();  // every byte is in its file before a buffer is sized from the index

  std::string tmp = parent + "/." + fs::path(out_dir).filename().string() + ".tmp-XXXXXX";
  if (!::mkdtemp(tmp.data()))
    throw Error(ErrorCode::checkpoint, "cannot create a temporary directory in " + parent + ": " + std::strerror(errno));
  try {
    const ExportStats stats = write_files(reader, spec, tmp, o);
    ck::fsync_path(tmp);
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out_dir.c_str(), RENAME_NOREPLACE) != 0)
      throw Error(ErrorCode::config, "cannot move the export to OUT_DIR = " + out_dir + ": " + std::strerror(errno),
                  "name a directory that does not exist yet");
    ck::fsync_path(parent);
    return stats;
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace dtrain::hf
