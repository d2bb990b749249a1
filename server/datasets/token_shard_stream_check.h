// Checks an llm.c token shard's bytes as they stream past in an upload: the magic and version as
// soon as the header's first bytes arrive, then exactly the 2 * count token bytes the header
// announces; keeps the largest token. Nothing of the data is kept.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln::server {

class TokenShardStreamCheck {
 public:
  // `name` (the file name) prefixes every error.
  explicit TokenShardStreamCheck(std::string name) : name_(std::move(name)) {}

  // The next bytes. A wrong magic or version is InvalidArgument at once; bytes beyond what the
  // header announces are InvalidArgument saying the count and the size.
  absl::Status Consume(absl::string_view bytes);
  // InvalidArgument when the file ended before its header or its tokens did.
  absl::Status Finish() const;

  // Valid after a successful Finish.
  int64_t tokens() const { return count_; }
  // The largest token; -1 for none.
  int32_t max_token() const { return max_token_; }

 private:
  absl::Status CheckHeader();
  std::string name_;
  std::string head_;  // the header's bytes until all 1024 are in
  int64_t count_ = 0;
  int64_t bytes_ = 0;  // file bytes seen
  int odd_byte_ = -1;  // the low byte of a token split between chunks
  int32_t max_token_ = -1;
};

}  // namespace kiln::server
