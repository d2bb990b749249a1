// Inflates a gzip stream fed in pieces of any size, handing the decompressed bytes on in pieces
// of at most 64 KiB: memory stays bounded whatever the compression ratio, so a caller counting
// what comes out can stop a gzip bomb as soon as it passes a limit.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln::server {

class GunzipStream {
 public:
  // Receives each decompressed piece; an error stops the inflating and is returned by Feed.
  using Sink = std::function<absl::Status(absl::string_view)>;

  // `name` prefixes every error (a file name).
  explicit GunzipStream(std::string name);
  ~GunzipStream();
  GunzipStream(const GunzipStream&) = delete;
  GunzipStream& operator=(const GunzipStream&) = delete;

  // Inflates `compressed` (the next bytes of the file) into `sink`. Concatenated gzip members
  // are one stream, as gzip itself reads them; anything else is DataLoss naming the problem.
  absl::Status Feed(absl::string_view compressed, const Sink& sink);
  // DataLoss when the input stopped inside a member (or held none).
  absl::Status Finish() const;

 private:
  std::string name_;
  z_stream z_{};
  bool initialized_ = false;
  bool in_member_ = false;  // a member started and has not ended
  bool saw_member_ = false;
};

}  // namespace kiln::server
