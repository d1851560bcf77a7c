// Helpers shared by the integration tests that train through `dtrain launch`:
// a free loopback port, deterministic training text, and the trainer's
// final-parameter dump (DTPARAMS1, engine/trainer/train_session.h).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

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

// The DTPARAMS1 file rank 0 writes when DTRAIN_DUMP_PARAMS is set: a magic
// line, then per tensor "name count\n" and count raw fp32 values.
inline std::map<std::string, std::vector<float>> read_params(const std::string& path) {
  std::map<std::string, std::vector<float>> params;
  std::ifstream in(path, std::ios::binary);
  std::string line;
  if (!std::getline(in, line) || line != "DTPARAMS1") return params;
  while (std::getline(in, line)) {
    auto sp = line.rfind(' ');
    std::vector<float> v(std::stoull(line.substr(sp + 1)));
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
    params[line.substr(0, sp)] = std::move(v);
  }
  return params;
}

}  // namespace dtrain::testing
