// Helpers shared by the integration tests that train through `dtrain launch`:
// a free loopback port, deterministic training text, and a run's final
// parameters as the real `dtrain ckpt merge` writes them from its checkpoint
// (the trainer saves one after the last step when checkpoint.dir is set).
// Safetensors files are read with common/safetensors.h (dtrain_common).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "tests/support/child.h"

namespace dtrain::testing {

// A port that was free on 127.0.0.1 a moment ago (bind port 0, read it back).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// `bytes` of deterministic word salad (xorshift over `words`): learnable
// bytes without a data file.
inline std::string word_salad(size_t bytes, const std::vector<std::string>& words) {
  std::string text;
  uint64_t x = 88172645463325252ULL;
  while (text.size() < bytes) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    text += words[x % words.size()];
  }
  text.resize(bytes);
  return text;
}

// Flips the last byte of every rank file of a checkpoint step (tensor data,
// not the header): its checksum no longer matches the index. Returns how
// many files it changed.
inline int corrupt_step(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));
    ++n;
  }
  return n;
}

// The step dir a checkpoint root's `latest` names ("step_20"), "" when none.
inline std::string read_latest(const std::string& root) {
  std::string s = read_file(root + "/latest");
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The F32 tensors of a safetensors file, name -> values (row-major); other
// dtypes (a shard's U8 RNG states) are left out. Throws dtrain::Error naming
// the file when it is missing, truncated or not safetensors.
inline std::map<std::string, std::vector<float>> read_safetensors_f32(const std::string& path) {
  dtrain::safetensors::File file(path);
  std::map<std::string, std::vector<float>> out;
  for (const auto& t : file.tensors()) {
    if (t.dtype != "F32") continue;
    std::vector<float> v(t.nbytes() / sizeof(float));
    file.read(t, v.data());
    out[t.name] = std::move(v);
  }
  return out;
}

// A run's parameters at a checkpoint (a step_<N> dir, or a run's
// checkpoint.dir for its `latest`), name -> fp32 values: runs the real
// `dtrain ckpt merge` into <work_dir>/<checkpoint path below work_dir, '/'
// as '_'>.merged.safetensors (replaced when it exists; its log beside it)
// and reads that file. work_dir is the test's temporary directory, so
// nothing is left behind. Throws std::runtime_error with the merge's output
// when it fails.
inline std::map<std::string, std::vector<float>> read_checkpoint_params(const std::string& ckpt,
                                                                         const std::string& work_dir) {
  std::string rel = ckpt;
  while (rel.size() > 1 && rel.back() == '/') rel.pop_back();
  if (rel.rfind(work_dir + "/", 0) == 0) rel = rel.substr(work_dir.size() + 1);
  for (char& c : rel) if (c == '/') c = '_';
  const std::string out = work_dir + "/" + rel + ".merged.safetensors";
  auto [code, output] =
      run_command({dtrain_bin(), "ckpt", "merge", ckpt, out, "--force"}, out + ".log", 120);
  if (code != 0)
    throw std::runtime_error("dtrain ckpt merge " + ckpt + " " + out + " exited " +
                             std::to_string(code) + ":\n" + output);
  return read_safetensors_f32(out);
}

}  // namespace dtrain::testing
