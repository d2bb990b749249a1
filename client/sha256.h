// Incremental SHA-256 (OpenSSL), hex-encoded, for checking exported and uploaded files.
#pragma once

#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace kiln::client {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view data);
  // The lower-case hex digest of everything passed to Update; call once.
  std::string HexDigest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kiln::client
