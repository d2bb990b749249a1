#include "engine/data/token_data.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/data/data_file.h"
#include "engine/rng.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// vocab.json of kMaxCharVocabulary characters is well under this.
constexpr int64_t kMaxVocabularyFileBytes = 4 << 20;

__extension__ typedef unsigned __int128 Uint128;

// The hash that picks window i of batch `draw`: SplitMix64 chained over the three counters, so
// any (seed, draw, i) is computed alone.
uint64_t WindowHash(uint64_t seed, uint64_t draw, uint64_t i) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ draw) ^ i);
}

// Opens the shards named `prefix`NNN.bin in `dir`, in order of NNN.
absl::StatusOr<TokenSplit> OpenSplit(const std::string& dir, std::string_view prefix) {
  std::map<int, std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const int n = TokenShardNumber(name, prefix);
    if (n < 0) continue;
    if (auto [it, fresh] = names.emplace(n, name); !fresh) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": ", it->second, " and ", name, " are both shard ", n));
    }
  }
  if (ec) return absl::UnavailableError(absl::StrCat(dir, ": ", ec.message()));
  TokenSplit split;
  for (const auto& [n, name] : names) {
    KILN_ASSIGN_OR_RETURN(TokenShard shard, TokenShard::Open(dir + "/" + name));
    split.shards.push_back(std::move(shard));
  }
  return split;
}

int32_t MaxTokenOf(const TokenSplit& split) {
  int32_t best = -1;
  for (const TokenShard& shard : split.shards) best = std::max(best, shard.MaxToken());
  return best;
}

}  // namespace

int TokenShardNumber(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() + 4 || name.substr(0, prefix.size()) != prefix ||
      name.substr(name.size() - 4) != ".bin") {
    return -1;
  }
  const std::string_view digits = name.substr(prefix.size(), name.size() - prefix.size() - 4);
  if (digits.size() < 3 || digits.size() > 6) return -1;
  int n = 0;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

int64_t TokenSplit::tokens() const {
  int64_t total = 0;
  for (const TokenShard& shard : shards) total += shard.size();
  return total;
}

int64_t TokenSplit::longest_shard() const {
  int64_t longest = 0;
  for (const TokenShard& shard : shards) longest = std::max(longest, shard.size());
  return longest;
}

absl::StatusOr<TokenDataset> OpenTokenDataset(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": token dataset folder does not exist"));
  }
  TokenDataset ds;
  KILN_ASSIGN_OR_RETURN(ds.train, OpenSplit(dir, kTokenTrainPrefix));
  if (ds.train.shards.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": no ", kTokenTrainPrefix, "NNN.bin token shard (the train split)"));
  }
  KILN_ASSIGN_OR_RETURN(ds.val, OpenSplit(dir, kTokenValPrefix));
  ds.max_token = std::max(MaxTokenOf(ds.train), MaxTokenOf(ds.val));
  const std::string vocab_path = absl::StrCat(dir, "/", kVocabularyFile);
  if (fs::exists(vocab_path, ec)) {
    KILN_ASSIGN_OR_RETURN(std::string text,
                          ReadDataFile(vocab_path, "a vocabulary", kMaxVocabularyFileBytes));
    if (static_cast<int64_t>(text.size()) > kMaxVocabularyFileBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(vocab_path, ": over ", kMaxVocabularyFileBytes, " bytes"));
    }
    KILN_ASSIGN_OR_RETURN(CharVocabulary vocab, CharVocabulary::FromJson(text, vocab_path));
    if (ds.max_token >= vocab.size()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": token ", ds.max_token, " is outside ",
                                                     kVocabularyFile, "'s ", vocab.size(),
                                                     " characters"));
    }
    ds.vocab_size = vocab.size();
    ds.vocabulary = std::move(vocab);
  }
  return ds;
}

absl::StatusOr<std::vector<WindowPosition>> DrawWindowPositions(const TokenSplit& split,
                                                                int64_t block_size, uint64_t seed,
                                                                uint64_t draw, int64_t first,
                                                                int count) {
  if (block_size < 1 || first < 0 || count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("token windows: block_size ", block_size,
                                                   ", first ", first, ", count ", count,
                                                   ": the block size must be positive, the others "
                                                   "not negative"));
  }
  // ends[k]: valid starts in shards 0..k; shard k has size - block_size of them.
  std::vector<uint64_t> ends;
  uint64_t total = 0;
  for (const TokenShard& shard : split.shards) {
    total += static_cast<uint64_t>(std::max<int64_t>(0, shard.size() - block_size));
    ends.push_back(total);
  }
  if (total == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token windows: no shard holds block_size + 1 = ", block_size + 1,
        " tokens (the longest of ", split.shards.size(), " holds ", split.longest_shard(), ")"));
  }
  std::vector<WindowPosition> out(static_cast<size_t>(count));
  for (int j = 0; j < count; ++j) {
    const uint64_t i = static_cast<uint64_t>(first) + static_cast<uint64_t>(j);
    // Multiply-shift maps 64 random bits onto [0, total) without a modulo's bias toward the
    // low values (left: total / 2^64, nothing for any shard kiln can hold).
    const auto pick =
        static_cast<uint64_t>((static_cast<Uint128>(WindowHash(seed, draw, i)) * total) >> 64);
    const size_t k =
        static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), pick) - ends.begin());
    out[static_cast<size_t>(j)].shard = static_cast<int>(k);
    out[static_cast<size_t>(j)].start = static_cast<int64_t>(pick - (k == 0 ? 0 : ends[k - 1]));
  }
  return out;
}

absl::Status GatherWindows(const TokenSplit& split, int64_t block_size, uint64_t seed,
                           uint64_t draw, int64_t first, int count, int32_t* x, int32_t* y,
                           int32_t vocab_size) {
  KILN_ASSIGN_OR_RETURN(std::vector<WindowPosition> positions,
                        DrawWindowPositions(split, block_size, seed, draw, first, count));
  for (size_t j = 0; j < positions.size(); ++j) {
    const TokenShard& shard = split.shards[static_cast<size_t>(positions[j].shard)];
    const int64_t s = positions[j].start;
    int32_t* xr = x + static_cast<int64_t>(j) * block_size;
    int32_t* yr = y + static_cast<int64_t>(j) * block_size;
    for (int64_t t = 0; t <= block_size; ++t) {
      const int32_t token = shard[s + t];
      if (vocab_size > 0 && token >= vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(shard.path(), ": token ", token, " at position ", s + t,
                         " is outside the vocabulary of ", vocab_size));
      }
      if (t < block_size) xr[t] = token;
      if (t > 0) yr[t - 1] = token;
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
