// Hugging Face import (hf_io.h): config.json to a spec, every HF tensor
// checked against the parameter table before anything is written, then one
// rank file streamed tensor by tensor: each HF tensor memory-mapped alone,
// converted to fp32 in chunks whose pages are dropped once used, checksummed
// and appended. Peak memory is a chunk, not the model.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "common/checkpoint_dir.h"
#include "common/checkpoint_index.h"
#include "common/checkpoint_writer.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "common/hf_io.h"
#include "common/hf_llama.h"
#include "common/hf_source.h"
#include "common/model_signature.h"
#include "common/safetensors_stream.h"

namespace dtrain::hf {
namespace fs = std::filesystem;
namespace ck = dtrain::checkpoint;

namespace {

constexpr const char* kRankFile = "rank_0.safetensors";
constexpr size_t kChunkElems = size_t(1) << 22;  // 16 MB of fp32 per conversion chunk

// Appends HF tensor `t` as fp32 to `out`, extending `crc`: mapped alone,
// converted kChunkElems at a time, each chunk's source pages released after.
void stream_as_fp32(const SourceTensor& t, safetensors::StreamWriter& out, uint32_t& crc) {
  const size_t esize = safetensors::dtype_size(t.info.dtype);
  const uint64_t start = t.file->data_start() + t.info.begin;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t map_off = start - start % page, lead = start - map_off;
  const size_t map_len = size_t(lead + t.info.nbytes());
  if (t.info.nbytes() == 0) return;
  void* map = ::mmap(nullptr, map_len, PROT_READ, MAP_PRIVATE, t.file->fd(), off_t(map_off));
  if (map == MAP_FAILED)
    throw Error(ErrorCode::checkpoint, "cannot map tensor " + t.info.name + " of " + t.file->path() + ": " +
                                           std::strerror(errno));
  ::madvise(map, map_len, MADV_SEQUENTIAL);
  const auto* src = static_cast<const uint8_t*>(map) + lead;
  const size_t n = t.info.nbytes() / esize;
  std::vector<float> buf(std::min(n, kChunkElems));
  size_t released = 0;  // bytes of the mapping already given back
  for (size_t i = 0; i < n; i += kChunkElems) {
    const size_t k = std::min(kChunkElems, n - i);
    to_fp32(t.info.dtype, src + i * esize, buf.data(), k);
    crc = crc32c_extend(crc, buf.data(), k * 4);
    out.append(buf.data(), k * 4);
    const size_t done = size_t(lead + (i + k) * esize) / page * page;  // whole pages behind us
    if (done > released) {
      ::madvise(static_cast<uint8_t*>(map) + released, done - released, MADV_DONTNEED);
      released = done;
    }
  }
  ::munmap(map, map_len);
}

ck::TensorEntry entry_of(const LlamaParam& p, uint32_t crc) {
  std::vector<ck::Range> all;
  for (int64_t d : p.shape) all.emplace_back(0, d);
  return {"model/" + p.name, "F32", p.shape, {ck::Shard{kRankFile, "model/" + p.name, all, crc}}};
}

// Writes <tmp>/rank_0.safetensors: every parameter, in table order.
uint64_t write_rank_file(const std::string& path, const std::vector<LlamaParam>& params, const HfSource& src) {
  std::vector<safetensors::TensorSpec> specs;
  std::vector<ck::TensorEntry> bound;
  for (const auto& p : params) {
    specs.push_back({"model/" + p.name, "F32", p.shape});
    bound.push_back(entry_of(p, 0xFFFFFFFFu));  // the widest checksum text
  }
  safetensors::StreamWriter out(path, specs, {{ck::kShardsMetadataKey, ck::shards_to_metadata(bound)}});
  std::vector<ck::TensorEntry> entries;
  for (const auto& p : params) {
    uint32_t crc = 0;
    for (const auto& piece : p.pieces) stream_as_fp32(src.at(piece.name), out, crc);
    entries.push_back(entry_of(p, crc));
  }
  out.finish({{ck::kShardsMetadataKey, ck::shards_to_metadata(entries)}});
  return out.data_bytes();
}

}  // namespace

JobSpec import_spec(const std::string& hf_dir, const std::vector<std::string>& sets) {
  JobSpec base;
  base.model = model_from_config(read_config(hf_dir), hf_dir + "/config.json");
  return parse_job_spec(job_spec_to_yaml(base), hf_dir + "/config.json", sets);
}

void check_model_matches(const std::string& hf_dir, const ModelSpec& m) {
  const std::string source = hf_dir + "/config.json";
  ModelSpec hf = model_from_config(read_config(hf_dir), source);
  if (m.moe.experts > 0) hf.ffn_hidden = m.ffn_hidden;  // unused by an all-MoE model
  const std::string diff = architecture_difference(m, hf, "in this run's spec", "in " + source);
  if (!diff.empty())
    throw Error(ErrorCode::config, "train.init_from = " + hf_dir + ": another architecture: " + diff,
                "set the model section to the Hugging Face model's (dtrain ckpt import-hf " + hf_dir +
                    " OUT --spec-out SPEC.yaml writes one), or initialise from another model");
}

void check_import_target(const std::string& out_dir, const std::string& field) {
  std::error_code ec;
  const auto st = fs::symlink_status(out_dir, ec);
  if (ec || !fs::exists(st)) return;
  if (fs::is_directory(st) && fs::is_empty(out_dir, ec) && !ec) return;
  throw Error(ErrorCode::config,
              field + " = " + out_dir + " already exists" +
                  (fs::is_symlink(st) ? " (a symbolic link)" : fs::is_directory(st) ? " and is not empty" : ""),
              "name a new directory; an import never writes over anything");
}

ImportStats import_checkpoint(const std::string& hf_dir, const JobSpec& spec, const std::string& out_dir) {
  check_import_target(out_dir, "OUT_DIR");
  const std::vector<LlamaParam> params = llama_params(spec.model);
  HfSource src(hf_dir);
  src.check(params, spec.model.tie_embeddings);  // every problem before anything is written

  std::error_code ec;
  const bool created = !fs::exists(out_dir, ec);
  ImportStats stats;
  try {
    fs::create_directories(out_dir);
    ck::prepare_tmp_dir(out_dir, 0);
    const std::string tmp = ck::tmp_dir(out_dir, 0);
    stats.bytes = write_rank_file(tmp + "/" + kRankFile, params, src);
    ck::Index x;
    x.step = 0;
    x.mesh = "dp=1,tp=1,pp=1,ep=1";
    x.world = 1;
    x.model = ck::model_signature(spec.model);
    x.weights_only = true;
    x.schedule = {spec.train.lr, spec.train.min_lr, spec.train.warmup_steps, spec.train.steps};
    x.spec_yaml = job_spec_to_yaml(spec);
    x.files = {kRankFile};
    ck::write_index(tmp, x);
    ck::commit(out_dir, 0, 0);
  } catch (...) {
    // Nothing half-written stays: the directory this call made, or what it
    // put in the empty one it was given.
    if (created) {
      fs::remove_all(out_dir, ec);
    } else {
      for (const auto& e : fs::directory_iterator(out_dir, ec)) fs::remove_all(e.path(), ec);
    }
    throw;
  }
  stats.tensors = int(params.size());
  stats.step_dir = out_dir + "/" + ck::step_dir_name(0);
  return stats;
}

}  // namespace dtrain::hf
