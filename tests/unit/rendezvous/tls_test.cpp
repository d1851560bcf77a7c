// The rendezvous' TLS identities (rendezvous/tls.h): the token-derived one is
// the same for every holder of the token and differs between tokens; CA mode
// (cluster.rendezvous.tls files) admits a client of the same CA and refuses,
// with a clear error, one with another CA or a certificate the CA did not
// sign. On-the-wire checks: tls_wire_test.cpp.
#include <doctest/doctest.h>

#include <string>

#include "common/error.h"
#include "common/job_spec.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/rendezvous_server.h"
#include "rendezvous/tls.h"

using namespace dtrain::rendezvous;
using dtrain::Error;
using dtrain::ErrorCode;

namespace {

TlsIdentity ca_mode(const std::string& ca, const CertAndKey& own) {
  TlsIdentity id;
  id.ca = ca;
  id.cert = own.cert;
  id.key = own.key;
  id.mutual = true;
  return id;
}

struct CaServer {
  RendezvousServer server;
  int port;
  explicit CaServer(TlsIdentity tls) : server(options(std::move(tls))) {
    port = server.start("127.0.0.1:0");
  }
  static ServerOptions options(TlsIdentity tls) {
    ServerOptions o;
    o.job = "job-ca";
    o.token = "ca-token";
    o.tls = std::move(tls);
    o.mesh = dtrain::mesh::make_mesh(1, 1, 1, 1);
    return o;
  }
  // Join (waits for the server) from a client with `tls`: the error.
  std::string join_error(TlsIdentity tls) const {
    ClientOptions c;
    c.endpoint = "127.0.0.1:" + std::to_string(port);
    c.job = "job-ca";
    c.token = "ca-token";
    c.tls = std::move(tls);
    c.call_timeout_s = 5;
    JoinInfo j;
    j.node_id = "node-0";
    j.host = "127.0.0.1";
    j.master_port = 30000;
    try {
      RendezvousClient(c).join(j, 60);
      return "";
    } catch (const Error& e) {
      return e.message();
    }
  }
  // Status from a client with `tls`: "" when it answered, else the error.
  std::string status_error(TlsIdentity tls, const std::string& token = "ca-token") const {
    ClientOptions c;
    c.endpoint = "127.0.0.1:" + std::to_string(port);
    c.job = "job-ca";
    c.token = token;
    c.tls = std::move(tls);
    c.call_timeout_s = 5;
    try {
      RendezvousClient(c).status();
      return "";
    } catch (const Error& e) {
      return e.message();
    }
  }
};

}  // namespace

TEST_CASE("tls: the token's identity is the same for every holder and differs between tokens") {
  TlsIdentity a = token_tls_identity("token-a");
  TlsIdentity again = token_tls_identity(std::string("token-") + "a");
  TlsIdentity b = token_tls_identity("token-b");
  // Booleans, so that a report never prints the PEM text.
  const bool a_is_pem = a.cert.find("BEGIN CERTIFICATE") != std::string::npos &&
                        a.key.find("BEGIN PRIVATE KEY") != std::string::npos;
  const bool same_for_every_holder = a.cert == again.cert && a.key == again.key;
  const bool self_signed = a.cert == a.ca;  // the client trusts exactly it
  const bool differs_between_tokens = a.cert != b.cert && a.key != b.key;
  CHECK(a_is_pem);
  CHECK(same_for_every_holder);
  CHECK(self_signed);
  CHECK(differs_between_tokens);
  CHECK(a.server_name == kTokenCertName);
  const std::string fa = certificate_fingerprint(a.cert), fb = certificate_fingerprint(b.cert);
  MESSAGE("token-a sha256 " << fa << ", token-b sha256 " << fb);
  CHECK(fa.size() == 64);
  CHECK(fa != fb);
}

TEST_CASE("tls: CA mode admits a client of the CA and refuses another CA or an unsigned cert") {
  const CertAndKey server_cert = self_signed_certificate({"127.0.0.1"});
  const CertAndKey other = self_signed_certificate({"127.0.0.1"});
  CaServer s(ca_mode(server_cert.cert, server_cert));

  // The same CA (here the server's self-signed certificate, which signs the
  // client's too): admitted.
  CHECK(s.status_error(ca_mode(server_cert.cert, server_cert)) == "");

  // The CA's client with another token: the server's own check refuses it.
  CHECK(s.status_error(ca_mode(server_cert.cert, server_cert), "not-the-token")
            .find("wrong token: set DTRAIN_TOKEN") != std::string::npos);

  // Another CA: the client refuses the server.
  const std::string wrong_ca = s.status_error(ca_mode(other.cert, other));
  MESSAGE("wrong CA: " << wrong_ca);
  CHECK(wrong_ca.find("TLS handshake with the rendezvous server at 127.0.0.1:") !=
        std::string::npos);
  CHECK(wrong_ca.find("not signed by cluster.rendezvous.tls.ca") != std::string::npos);

  // The right CA but a client certificate it did not sign: the server refuses.
  const std::string unsigned_client = s.status_error(ca_mode(server_cert.cert, other));
  MESSAGE("client certificate of another CA: " << unsigned_client);
  CHECK(unsigned_client.find("refused this node's certificate") != std::string::npos);
  // ... also for a join, which waits for the server: at once, not at its timeout.
  const std::string unsigned_join = s.join_error(ca_mode(server_cert.cert, other));
  MESSAGE("join with a client certificate of another CA: " << unsigned_join);
  CHECK(unsigned_join.find("refused this node's certificate") != std::string::npos);

  // A token-derived client (no tls files) does not trust the CA's server.
  const std::string derived = s.status_error(TlsIdentity{});
  MESSAGE("token-derived client: " << derived);
  CHECK(derived.find("TLS handshake") != std::string::npos);
}

TEST_CASE("tls: cluster.rendezvous.tls files that cannot be read name the field and the path") {
  dtrain::RendezvousSpec spec;
  CHECK(tls_identity_from_spec(spec).derived());  // no files: derived from the token
  spec.tls_ca = "/nonexistent/ca.pem";
  spec.tls_cert = "/nonexistent/cert.pem";
  spec.tls_key = "/nonexistent/key.pem";
  try {
    tls_identity_from_spec(spec);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::config);
    CHECK(e.message() == "cluster.rendezvous.tls.ca = /nonexistent/ca.pem: cannot read the file");
  }
}
