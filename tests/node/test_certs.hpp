#pragma once

// Throwaway X.509 material for TLS tests, made with OpenSSL's API (no
// `openssl` binary needed): a CA, and certificates it (or a rogue CA) signed.

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

namespace stitch::testing {

struct key_and_cert {
  std::shared_ptr<EVP_PKEY> key;
  std::shared_ptr<X509> cert;
};

inline void check(bool ok, const char* what) {
  if (!ok)
    throw std::runtime_error(std::string{"test certificate: "} + what);
}

/// A P-256 key and a certificate for `cn`, signed by `issuer` (self-signed
/// when null); a CA certificate when `ca`.
inline key_and_cert make_cert(const std::string& cn, const key_and_cert* issuer, bool ca) {
  key_and_cert out;
  out.key = std::shared_ptr<EVP_PKEY>(EVP_EC_gen("P-256"), EVP_PKEY_free);
  check(out.key != nullptr, "key generation");
  out.cert = std::shared_ptr<X509>(X509_new(), X509_free);
  X509* x = out.cert.get();
  static long serial = 1;
  check(X509_set_version(x, 2) == 1, "version");
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600L * 24);
  check(X509_set_pubkey(x, out.key.get()) == 1, "public key");
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer->cert.get()) : name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer ? issuer->cert.get() : x, x, nullptr, nullptr, 0);
  auto add = [&](int nid, const char* value) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    check(ext != nullptr, "extension");
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  };
  add(NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
  add(NID_key_usage, ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature");
  if (!ca) {
    add(NID_ext_key_usage, "serverAuth,clientAuth");
    // HTTPS clients check the host name: every test serves on loopback.
    add(NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  }
  check(X509_sign(x, issuer ? issuer->key.get() : out.key.get(), EVP_sha256()) > 0, "signature");
  return out;
}

inline void write_pem(const key_and_cert& kc, const std::filesystem::path& cert_file,
                      const std::filesystem::path& key_file) {
  FILE* c = std::fopen(cert_file.c_str(), "w");
  check(c != nullptr, "open cert file");
  PEM_write_X509(c, kc.cert.get());
  std::fclose(c);
  if (key_file.empty())
    return;
  FILE* k = std::fopen(key_file.c_str(), "w");
  check(k != nullptr, "open key file");
  PEM_write_PrivateKey(k, kc.key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(k);
}

/// In `dir`: ca.pem; node.pem/node.key signed by it; rogue-ca.pem and
/// rogue.pem/rogue.key signed by the rogue CA.
inline void write_test_pki(const std::filesystem::path& dir) {
  auto ca = make_cert("stitch test CA", nullptr, true);
  auto node = make_cert("stitch node", &ca, false);
  auto rogue_ca = make_cert("rogue CA", nullptr, true);
  auto rogue = make_cert("rogue node", &rogue_ca, false);
  write_pem(ca, dir / "ca.pem", {});
  write_pem(node, dir / "node.pem", dir / "node.key");
  write_pem(rogue_ca, dir / "rogue-ca.pem", {});
  write_pem(rogue, dir / "rogue.pem", dir / "rogue.key");
}

} // namespace stitch::testing
