// Turns a UTF-8 text corpus into a character-level token dataset as nanoGPT's
// shakespeare_char/prepare.py does: the vocabulary is the sorted set of characters, the first
// int(n * (1 - val_fraction)) characters are the train split and the rest the validation split;
// written as train_000.bin, val_000.bin (llm.c shards) and vocab.json.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/data/char_vocabulary.h"

namespace kiln {

inline constexpr double kDefaultValFraction = 0.1;

// One file of a corpus: its name (for errors) and its bytes (often a MappedFile's).
struct TextSource {
  std::string name;
  std::string_view text;
};

struct TextCorpusFacts {
  CharVocabulary vocabulary;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
};

// Encodes `sources`, concatenated in order, into `dir` (which must exist): train_000.bin,
// val_000.bin and vocab.json, each written atomically. Streams: holds no copy of the text and
// no token array. InvalidArgument naming the file for text that is not UTF-8 (with the byte
// offset), for an empty corpus, more than kMaxCharVocabulary characters, splits that would be
// empty, a train split over kMaxShardTokens, or val_fraction outside (0, 0.5].
absl::StatusOr<TextCorpusFacts> EncodeTextCorpus(std::span<const TextSource> sources,
                                                 double val_fraction, const std::string& dir);

}  // namespace kiln
