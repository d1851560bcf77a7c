// The job's shared rendezvous token: where it comes from (DTRAIN_TOKEN, else
// cluster.rendezvous.token_file; never the YAML itself), how to make one, and
// the constant-time comparison the server uses. No gRPC here.
#pragma once

#include <string>

namespace dtrain::rendezvous {

// DTRAIN_TOKEN when set and non-empty; else the contents of token_file
// (whitespace-trimmed) when token_file is non-empty. Throws Error(config) when
// token_file is named but missing, unreadable or empty. With neither set:
// throws Error(config) if `required`, else returns "".
std::string read_token(const std::string& token_file, bool required = true);

// 32 hex characters from /dev/urandom (for a one-machine job with no token).
std::string random_token();

// Equality that takes the same time wherever the first difference is (no
// early exit); lengths are compared too.
bool tokens_equal(const std::string& expected, const std::string& given);

}  // namespace dtrain::rendezvous
