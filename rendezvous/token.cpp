// Reading, making and comparing the rendezvous token (token.h). The token is a
// secret: it is never logged and never part of an error message.
#include "rendezvous/token.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace dtrain::rendezvous {
namespace {

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

}  // namespace

std::string read_token(const std::string& token_file, bool required) {
  const char* env = std::getenv("DTRAIN_TOKEN");
  if (env && *env) return trim(env);
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in)
      throw Error(ErrorCode::config,
                  "cluster.rendezvous.token_file = " + token_file + ": cannot read the file",
                  "create it (e.g. `openssl rand -hex 16 > " + token_file +
                      "`) on every node, or set DTRAIN_TOKEN");
    std::ostringstream text;
    text << in.rdbuf();
    std::string token = trim(text.str());
    if (token.empty())
      throw Error(ErrorCode::config,
                  "cluster.rendezvous.token_file = " + token_file + ": the file is empty",
                  "write the job's token into it, or set DTRAIN_TOKEN");
    return token;
  }
  if (required)
    throw Error(ErrorCode::config, "no rendezvous token: DTRAIN_TOKEN is not set and the spec "
                                   "has no cluster.rendezvous.token_file",
                "set DTRAIN_TOKEN to a shared secret (the same on every node), or name a file "
                "holding it in cluster.rendezvous.token_file");
  return "";
}

std::string random_token() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[16] = {};
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes))
    throw Error(ErrorCode::internal, "cannot read /dev/urandom for a rendezvous token");
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += hex[b >> 4];
    token += hex[b & 15];
  }
  return token;
}

bool tokens_equal(const std::string& expected, const std::string& given) {
  // Walk the longer length so the time depends on lengths only, never on
  // where the strings differ.
  size_t n = expected.size() > given.size() ? expected.size() : given.size();
  unsigned diff = expected.size() == given.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    unsigned char a = i < expected.size() ? static_cast<unsigned char>(expected[i]) : 0;
    unsigned char b = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned>(a ^ b);
  }
  return diff == 0;
}

}  // namespace dtrain::rendezvous
