// Making and reading the rendezvous' TLS identities (tls.h) with OpenSSL's
// libcrypto. OpenSSL failures become Error(internal) here; the token and
// private keys never appear in a message.
#include "rendezvous/tls.h"

#include <arpa/inet.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "common/error.h"
#include "common/job_spec.h"

namespace dtrain::rendezvous {
namespace {

// scrypt's "interactive" parameters (16 MiB, ~50 ms): a guess at a weak
// token costs an attacker who saw the public key as much.
constexpr uint64_t kScryptN = 1 << 14;
constexpr uint64_t kScryptR = 8, kScryptP = 1;
constexpr const char* kScryptSalt = "dtrain rendezvous tls v1";

template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using BioPtr = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;

void check(bool ok, const char* what) {
  if (!ok) throw Error(ErrorCode::internal, std::string("OpenSSL: ") + what + " failed");
}

std::string bio_text(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

void add_ext(X509* x, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  check(ext != nullptr, "X509V3_EXT_conf_nid");
  int ok = X509_add_ext(x, ext, -1);
  X509_EXTENSION_free(ext);
  check(ok == 1, "X509_add_ext");
}

bool is_ip(const std::string& name) {
  unsigned char buf[16];
  return inet_pton(AF_INET, name.c_str(), buf) == 1 || inet_pton(AF_INET6, name.c_str(), buf) == 1;
}

// A self-signed X.509 v3 certificate of `key` for `names`; every field
// fixed, so the same key gives the same bytes (Ed25519 signs deterministically).
CertAndKey self_signed(EVP_PKEY* key, const std::vector<std::string>& names) {
  X509Ptr x(X509_new());
  check(x != nullptr, "X509_new");
  check(X509_set_version(x.get(), 2) == 1, "X509_set_version");
  check(ASN1_INTEGER_set(X509_get_serialNumber(x.get()), 1) == 1, "serial");
  check(ASN1_TIME_set_string(X509_getm_notBefore(x.get()), "20200101000000Z") == 1, "notBefore");
  // RFC 5280: 99991231235959Z means "no well-defined expiration date".
  check(ASN1_TIME_set_string(X509_getm_notAfter(x.get()), "99991231235959Z") == 1, "notAfter");
  X509_NAME* name = X509_get_subject_name(x.get());
  check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                   reinterpret_cast<const unsigned char*>(names.front().c_str()),
                                   -1, -1, 0) == 1,
        "subject");
  check(X509_set_issuer_name(x.get(), name) == 1, "issuer");
  check(X509_set_pubkey(x.get(), key) == 1, "X509_set_pubkey");
  std::string san;
  for (const auto& n : names) san += (san.empty() ? "" : ",") + std::string(is_ip(n) ? "IP:" : "DNS:") + n;
  add_ext(x.get(), NID_subject_alt_name, san);
  add_ext(x.get(), NID_basic_constraints, "critical,CA:TRUE");
  check(X509_sign(x.get(), key, nullptr) > 0, "X509_sign");  // Ed25519: no digest

  BioPtr cert_bio(BIO_new(BIO_s_mem())), key_bio(BIO_new(BIO_s_mem()));
  check(PEM_write_bio_X509(cert_bio.get(), x.get()) == 1, "PEM_write_bio_X509");
  check(PEM_write_bio_PrivateKey(key_bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) == 1,
        "PEM_write_bio_PrivateKey");
  return {bio_text(cert_bio.get()), bio_text(key_bio.get())};
}

PkeyPtr ed25519_from_seed(const unsigned char seed[32]) {
  PkeyPtr key(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed, 32));
  check(key != nullptr, "EVP_PKEY_new_raw_private_key");
  return key;
}

TlsIdentity derive(const std::string& token) {
  unsigned char seed[32];
  check(EVP_PBE_scrypt(token.data(), token.size(),
                       reinterpret_cast<const unsigned char*>(kScryptSalt),
                       std::char_traits<char>::length(kScryptSalt), kScryptN, kScryptR, kScryptP,
                       64ull << 20, seed, sizeof seed) == 1,
        "EVP_PBE_scrypt");
  PkeyPtr key = ed25519_from_seed(seed);
  OPENSSL_cleanse(seed, sizeof seed);
  CertAndKey ck = self_signed(key.get(), {kTokenCertName});
  TlsIdentity id;
  id.ca = ck.cert;
  id.cert = ck.cert;
  id.key = ck.key;
  id.server_name = kTokenCertName;
  return id;
}

std::string read_pem(const std::string& field, const std::string& path, const char* marker) {
  std::ifstream in(path);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  const std::string hint = "give " + field + " a PEM file readable on every node (ca: the CA "
                           "certificate; cert, key: this node's certificate and private key)";
  if (!in) throw Error(ErrorCode::config, field + " = " + path + ": cannot read the file", hint);
  if (text.str().find(marker) == std::string::npos)
    throw Error(ErrorCode::config, field + " = " + path + ": no PEM " + marker + " in the file",
                hint);
  return text.str();
}

}  // namespace

TlsIdentity token_tls_identity(const std::string& token) {
  static std::mutex mu;
  static std::map<std::string, TlsIdentity> cache;  // a process sees one or two tokens
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(token);
  if (it == cache.end()) it = cache.emplace(token, derive(token)).first;
  return it->second;
}

TlsIdentity tls_identity_from_spec(const RendezvousSpec& spec) {
  TlsIdentity id;
  if (spec.tls_ca.empty() && spec.tls_cert.empty() && spec.tls_key.empty()) return id;
  // The validator requires all three together.
  id.ca = read_pem("cluster.rendezvous.tls.ca", spec.tls_ca, "CERTIFICATE");
  id.cert = read_pem("cluster.rendezvous.tls.cert", spec.tls_cert, "CERTIFICATE");
  id.key = read_pem("cluster.rendezvous.tls.key", spec.tls_key, "PRIVATE KEY");
  id.mutual = true;
  return id;
}

CertAndKey self_signed_certificate(const std::vector<std::string>& names) {
  if (names.empty()) throw Error(ErrorCode::internal, "self_signed_certificate: no names");
  PkeyPtr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  check(key != nullptr, "EVP_PKEY_Q_keygen");
  return self_signed(key.get(), names);
}

std::string certificate_fingerprint(const std::string& cert_pem) {
  BioPtr bio(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  X509Ptr x(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  check(x != nullptr, "PEM_read_bio_X509");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  check(X509_digest(x.get(), EVP_sha256(), md, &n) == 1, "X509_digest");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

}  // namespace dtrain::rendezvous
