#include "util/Sha256.h"

#include <flexjit/error.h>

#include <openssl/evp.h>

#include <cstdint>

namespace flexjit {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  FJ_ASSERT(ctx_ != nullptr, "EVP_MD_CTX_new failed");
  FJ_ASSERT(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1,
            "EVP_DigestInit_ex failed");
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}

Sha256& Sha256::update(std::string_view bytes) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), bytes.data(), bytes.size());
  return *this;
}

Sha256& Sha256::update_field(std::string_view bytes) {
  uint64_t n = bytes.size();
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), &n, sizeof n);
  return update(bytes);
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &len);
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kDigits[digest[i] >> 4];
    out += kDigits[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  return Sha256().update(bytes).hex();
}

}  // namespace flexjit
