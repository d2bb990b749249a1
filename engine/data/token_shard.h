// One llm.c token shard (.bin): a header of 256 little-endian int32 (magic 20240520, version 1,
// token count, the rest 0) and then `count` little-endian uint16 tokens. Shards are memory-mapped
// read-only, never read into memory whole; they are written atomically.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/data/mapped_file.h"

namespace kiln {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderBytes = 256 * 4;
// The header's count is an int32.
inline constexpr int64_t kMaxShardTokens = 0x7FFFFFFF;

// A read-only memory map of one shard. Move-only; unmaps on destruction. Reading tokens is
// thread-safe.
class TokenShard {
 public:
  // Maps `path` and checks its header: the magic, the version, and that the file is exactly
  // 1024 + 2 * count bytes. Errors name the file and what is wrong (InvalidArgument for a header
  // or size refused, NotFound, PermissionDenied or Unavailable when it cannot be opened).
  static absl::StatusOr<TokenShard> Open(const std::string& path);

  TokenShard() = default;
  // A moved-from shard is empty.
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  // Tokens in the shard.
  int64_t size() const { return count_; }
  // The mapped tokens (little-endian: the host order kiln builds for), size() of them.
  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(count_)}; }
  uint16_t operator[](int64_t i) const { return tokens_[i]; }
  const std::string& path() const { return file_.path(); }
  // The largest token, or -1 for an empty shard. Reads every token once (sequentially).
  int32_t MaxToken() const;

 private:
  MappedFile file_;  // the whole file, header included
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

// The 1024-byte header of a shard of `count` tokens.
std::string TokenShardHeader(int64_t count);

// Writes `tokens` as a shard at `path` atomically (temp file, fsync, rename). InvalidArgument for
// more than kMaxShardTokens tokens; file errors name the path.
absl::Status WriteTokenShard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace kiln
