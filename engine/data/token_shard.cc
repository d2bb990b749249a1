#include "engine/data/token_shard.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"

namespace kiln {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian and mapped as they are");

absl::StatusOr<TokenShard> TokenShard::Open(const std::string& path) {
  // Windows are drawn at random places: read-ahead would fetch pages no one asked for.
  KILN_ASSIGN_OR_RETURN(MappedFile file,
                        MappedFile::Open(path, "a token shard", MappedFile::Access::kRandom));
  const auto file_bytes = static_cast<int64_t>(file.size());
  if (file_bytes < kTokenShardHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated token shard: ", file_bytes,
                                                   " bytes, shorter than its ",
                                                   kTokenShardHeaderBytes, "-byte header"));
  }
  int32_t header[3];
  std::memcpy(header, file.bytes().data(), sizeof(header));
  if (header[0] != kTokenShardMagic) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": wrong magic ", header[0], " (expected ",
                                                   kTokenShardMagic, ", an llm.c token shard)"));
  }
  if (header[1] != kTokenShardVersion) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": unsupported version ", header[1],
                                                   " (expected ", kTokenShardVersion,
                                                   ": uint16 tokens)"));
  }
  const int64_t count = header[2];
  if (count < 0 || kTokenShardHeaderBytes + 2 * count != file_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the header says ", count, " tokens (", kTokenShardHeaderBytes + 2 * count,
        " bytes with the header) but the file has ", file_bytes, " bytes (",
        (file_bytes - kTokenShardHeaderBytes) / 2, " tokens)"));
  }
  TokenShard shard;
  shard.tokens_ = reinterpret_cast<const uint16_t*>(file.bytes().data() + kTokenShardHeaderBytes);
  shard.count_ = count;
  shard.file_ = std::move(file);  // moving keeps the mapping's address
  return shard;
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : file_(std::move(other.file_)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      count_(std::exchange(other.count_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    file_ = std::move(other.file_);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

int32_t TokenShard::MaxToken() const {
  if (count_ == 0) return -1;
  // One pass front to back: tell the kernel, then go back to random access for the draws.
  file_.Advise(MappedFile::Access::kSequential);
  uint16_t best = 0;
  for (int64_t i = 0; i < count_; ++i) best = std::max(best, tokens_[i]);
  file_.Advise(MappedFile::Access::kRandom);
  return best;
}

std::string TokenShardHeader(int64_t count) {
  int32_t header[256] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(count);
  return std::string(reinterpret_cast<const char*>(header), sizeof(header));
}

absl::Status WriteTokenShard(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(kMaxShardTokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", tokens.size(), " tokens; a shard holds at most ", kMaxShardTokens));
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> writer, AtomicFileWriter::Open(path));
  KILN_RETURN_IF_ERROR(writer->Append(TokenShardHeader(static_cast<int64_t>(tokens.size()))));
  KILN_RETURN_IF_ERROR(writer->Append(absl::string_view(
      reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t))));
  return writer->Commit();
}

}  // namespace kiln
