// The rendezvous' TLS identities (PEM text): the one derived from the job's
// token (the default: no files, no configuration), the one read from
// cluster.rendezvous.tls files, and self-signed certificates for tests.
// OpenSSL's libcrypto only; no gRPC here (rendezvous_server/client use these).
#pragma once

#include <string>
#include <vector>

namespace dtrain {
struct RendezvousSpec;
}

namespace dtrain::rendezvous {

// The name in a token-derived certificate; clients check it instead of the
// endpoint's host (the certificate proves the token, not an address).
inline constexpr const char* kTokenCertName = "dtrain-rendezvous";

struct TlsIdentity {
  // Empty cert: derived from the token by whoever uses it (server and client
  // of one job derive the same), so code that knows only a token gets TLS.
  std::string ca;    // PEM: what the peer's certificate must be signed by
  std::string cert;  // PEM: this side's certificate (chain)
  std::string key;   // PEM: its private key
  // The name the client checks the server's certificate for; "" = the
  // endpoint's host (CA mode).
  std::string server_name;
  // True: the server requires a client certificate signed by `ca` too
  // (cluster.rendezvous.tls files: every node has its own cert and key).
  bool mutual = false;
  bool derived() const { return cert.empty(); }
};

// The token's identity: an Ed25519 key from scrypt(token) and a self-signed
// certificate for kTokenCertName with fixed fields. Ed25519 signatures are
// deterministic, so every holder of the token builds the same certificate
// byte for byte: the client trusts exactly it, and only a holder of the
// token can present it. Cached per token (scrypt costs ~50 ms).
TlsIdentity token_tls_identity(const std::string& token);

// cluster.rendezvous.tls: empty (derived from the token) when no file is
// named; else the three files read, each Error(config) naming the field and
// the path when it cannot be read or holds no PEM.
TlsIdentity tls_identity_from_spec(const RendezvousSpec& spec);

// A fresh Ed25519 key and a self-signed certificate for `names` (IP
// addresses or DNS names), valid from 2020 on: a CA of its own. For tests.
struct CertAndKey {
  std::string cert, key;  // PEM
};
CertAndKey self_signed_certificate(const std::vector<std::string>& names);

// SHA-256 of the certificate's DER, as 64 hex digits (for logs: which
// certificate a server presents, never the key).
std::string certificate_fingerprint(const std::string& cert_pem);

}  // namespace dtrain::rendezvous
