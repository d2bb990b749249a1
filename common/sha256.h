// SHA-256 (OpenSSL), lower-case hex: incremental for streams, or of a whole string or file.
// The one digest helper: checkpoint export, dataset upload, auth tokens and the client use it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view data);
  // The digest of everything passed to Update; call one of the two, once.
  std::array<uint8_t, 32> Digest();
  std::string HexDigest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::array<uint8_t, 32> Sha256Digest(absl::string_view data);
std::string Sha256Hex(absl::string_view data);
// The hex digest of a file's contents; NotFound when it cannot be opened, DataLoss on a read error.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

}  // namespace kiln
