#include "server/datasets/token_shard_stream_check.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/data/token_shard.h"

namespace kiln::server {
namespace {

int32_t HeaderWord(const std::string& head, int i) {
  int32_t v = 0;
  std::memcpy(&v, head.data() + 4 * i, sizeof(v));
  return v;
}

}  // namespace

absl::Status TokenShardStreamCheck::CheckHeader() {
  // The magic is told as soon as its 4 bytes are in, so a wrong file stops at its first chunk.
  if (head_.size() >= 4 && HeaderWord(head_, 0) != kTokenShardMagic) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": wrong magic ", HeaderWord(head_, 0),
                                                   " (expected ", kTokenShardMagic,
                                                   ", an llm.c token shard)"));
  }
  if (head_.size() >= 8 && HeaderWord(head_, 1) != kTokenShardVersion) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": unsupported version ",
                                                   HeaderWord(head_, 1), " (expected ",
                                                   kTokenShardVersion, ": uint16 tokens)"));
  }
  if (head_.size() >= 12) {
    count_ = HeaderWord(head_, 2);
    if (count_ < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": the header says ", count_, " tokens"));
    }
  }
  return absl::OkStatus();
}

absl::Status TokenShardStreamCheck::Consume(absl::string_view bytes) {
  const int64_t header_before = static_cast<int64_t>(head_.size());
  if (header_before < kTokenShardHeaderBytes) {
    const size_t take = std::min<size_t>(kTokenShardHeaderBytes - header_before, bytes.size());
    head_.append(bytes.data(), take);
    bytes.remove_prefix(take);
    bytes_ += static_cast<int64_t>(take);
    KILN_RETURN_IF_ERROR(CheckHeader());
  }
  if (bytes.empty()) return absl::OkStatus();
  const int64_t expected = kTokenShardHeaderBytes + 2 * count_;
  bytes_ += static_cast<int64_t>(bytes.size());
  if (bytes_ > expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": the header says ", count_, " tokens (", expected,
                     " bytes with the header) but the file has at least ", bytes_, " bytes"));
  }
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    if (odd_byte_ < 0) {
      odd_byte_ = b;
    } else {
      max_token_ = std::max<int32_t>(max_token_, odd_byte_ | (b << 8));
      odd_byte_ = -1;
    }
  }
  return absl::OkStatus();
}

absl::Status TokenShardStreamCheck::Finish() const {
  if (static_cast<int64_t>(head_.size()) < kTokenShardHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": truncated token shard: ", bytes_,
                                                   " bytes, shorter than its ",
                                                   kTokenShardHeaderBytes, "-byte header"));
  }
  const int64_t expected = kTokenShardHeaderBytes + 2 * count_;
  if (bytes_ != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": the header says ", count_, " tokens (", expected,
                     " bytes with the header) but the file has ", bytes_, " bytes (",
                     (bytes_ - kTokenShardHeaderBytes) / 2, " tokens)"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::server
