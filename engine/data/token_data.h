// Token datasets for language models: a folder of llm.c shards (train_NNN.bin, val_NNN.bin) and,
// for text corpora, vocab.json; opened memory-mapped, and drawn from in seeded windows that a
// resumed job and every data-parallel rank draw identically. Including this header gives the
// whole token-data API: shards (token_shard.h), the character vocabulary (char_vocabulary.h) and
// the text encoder (text_corpus.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/data/char_vocabulary.h"
#include "engine/data/text_corpus.h"
#include "engine/data/token_shard.h"

namespace kiln {

inline constexpr char kTokenTrainPrefix[] = "train_";
inline constexpr char kTokenValPrefix[] = "val_";
inline constexpr char kVocabularyFile[] = "vocab.json";

// N when `file_name` is `prefix`N.bin with N of 3 to 6 digits ("train_000.bin"), else -1.
int TokenShardNumber(std::string_view file_name, std::string_view prefix);

// One split's shards, in order of their numbers.
struct TokenSplit {
  std::vector<TokenShard> shards;
  // Tokens in all shards.
  int64_t tokens() const;
  // The most tokens any one shard holds.
  int64_t longest_shard() const;
};

struct TokenDataset {
  TokenSplit train;
  TokenSplit val;  // no shards when the folder has no val_NNN.bin
  // The vocabulary's size for text datasets; 0 for token datasets (the job's model says).
  int32_t vocab_size = 0;
  std::optional<CharVocabulary> vocabulary;  // text datasets (vocab.json)
  // The largest token of either split; -1 when there are no tokens.
  int32_t max_token = -1;
};

// Opens a dataset folder: every train_NNN.bin (at least one) and val_NNN.bin, mapped, and
// vocab.json when present (whose size must then exceed every token). Reads every token once to
// find max_token. Errors name the folder or file and what is wrong.
absl::StatusOr<TokenDataset> OpenTokenDataset(const std::string& dir);

// Where a window starts: in shards[shard], at token `start`.
struct WindowPosition {
  int shard = 0;
  int64_t start = 0;
};

// Windows first .. first+count-1 of batch `draw`: each starts uniformly over all valid starts of
// the split (a window of block_size + 1 tokens lies inside one shard, so shards weigh by their
// number of valid starts), chosen by a hash of (seed, draw, i) alone. InvalidArgument when no
// shard holds block_size + 1 tokens (naming the block size and the longest shard), or for
// block_size < 1, first < 0, count < 0.
absl::StatusOr<std::vector<WindowPosition>> DrawWindowPositions(const TokenSplit& split,
                                                                int64_t block_size, uint64_t seed,
                                                                uint64_t draw, int64_t first,
                                                                int count);

// Gathers windows first .. first+count-1 of batch `draw` (DrawWindowPositions): x gets the
// window's tokens [s, s+T) and y [s+1, s+T+1), as int32, row after row; x and y hold
// count * block_size each. Stateless: a resumed job draws what the uninterrupted one would, and
// ranks gathering disjoint slices of one draw gather disjoint rows of one identical batch. With
// vocab_size > 0, a token >= vocab_size is InvalidArgument naming it, its shard and position.
absl::Status GatherWindows(const TokenSplit& split, int64_t block_size, uint64_t seed,
                           uint64_t draw, int64_t first, int count, int32_t* x, int32_t* y,
                           int32_t vocab_size = 0);

}  // namespace kiln
