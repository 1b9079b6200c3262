// SHA-256 (OpenSSL's libcrypto): the cryptographic hash behind cache keys.
#pragma once

#include <string>
#include <string_view>

namespace flexjit {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  // Adds bytes; update_field also adds the length, so that ("ab","c") != ("a","bc").
  Sha256& update(std::string_view bytes);
  Sha256& update_field(std::string_view bytes);
  std::string hex();  // 64 lowercase hex digits; finishes the hash

 private:
  void* ctx_;
};

std::string sha256_hex(std::string_view bytes);

}  // namespace flexjit
