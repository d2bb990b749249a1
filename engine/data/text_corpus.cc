#include "engine/data/text_corpus.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "engine/data/token_data.h"
#include "engine/data/utf8.h"

namespace kiln {
namespace {

// Tokens gathered before each write.
constexpr size_t kWriteBatch = size_t{1} << 16;

std::string NamesOf(std::span<const TextSource> sources) {
  std::vector<std::string> names;
  for (const TextSource& s : sources) names.push_back(s.name);
  return absl::StrJoin(names, ", ");
}

// The characters of every source (checked as UTF-8) and how many there are in all.
absl::Status CollectCharacters(std::span<const TextSource> sources, std::vector<bool>* seen,
                               int64_t* count) {
  seen->assign(0x110000, false);
  *count = 0;
  for (const TextSource& source : sources) {
    KILN_RETURN_IF_ERROR(CheckUtf8(source.text, source.name));
    size_t pos = 0;
    while (pos < source.text.size()) {
      char32_t c = 0;
      int len = 0;
      DecodeUtf8(source.text, pos, &c, &len);
      (*seen)[c] = true;
      ++*count;
      pos += static_cast<size_t>(len);
    }
  }
  return absl::OkStatus();
}

// Writes the corpus's tokens into two shards: the first `train_tokens` into `train`, the rest
// into `val`, whose headers are already written.
absl::Status WriteTokens(std::span<const TextSource> sources, const std::vector<uint16_t>& id_of,
                         int64_t train_tokens, AtomicFileWriter* train, AtomicFileWriter* val) {
  std::vector<uint16_t> batch;
  batch.reserve(kWriteBatch);
  int64_t written = 0;
  AtomicFileWriter* out = train;
  const auto flush = [&]() {
    absl::Status s = out->Append(absl::string_view(reinterpret_cast<const char*>(batch.data()),
                                                   batch.size() * sizeof(uint16_t)));
    batch.clear();
    return s;
  };
  for (const TextSource& source : sources) {
    size_t pos = 0;
    while (pos < source.text.size()) {
      char32_t c = 0;
      int len = 0;
      DecodeUtf8(source.text, pos, &c, &len);  // checked by CollectCharacters
      pos += static_cast<size_t>(len);
      batch.push_back(id_of[c]);
      ++written;
      if (batch.size() == kWriteBatch || written == train_tokens) {
        KILN_RETURN_IF_ERROR(flush());
        if (written == train_tokens) out = val;
      }
    }
  }
  return flush();
}

}  // namespace

absl::StatusOr<TextCorpusFacts> EncodeTextCorpus(std::span<const TextSource> sources,
                                                 double val_fraction, const std::string& dir) {
  if (!(val_fraction > 0 && val_fraction <= 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("val_fraction: must be in (0, 0.5], got ", val_fraction));
  }
  const std::string names = NamesOf(sources);
  std::vector<bool> seen;
  int64_t n = 0;
  KILN_RETURN_IF_ERROR(CollectCharacters(sources, &seen, &n));
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.empty() ? "no file" : names, ": the text corpus is empty"));
  }
  std::vector<char32_t> chars;
  for (char32_t c = 0; c < seen.size(); ++c) {
    if (seen[c]) chars.push_back(c);
  }
  KILN_ASSIGN_OR_RETURN(CharVocabulary vocab, CharVocabulary::FromCharacters(chars, names));
  // nanoGPT: train_data = data[:int(n * 0.9)].
  const auto train_tokens = static_cast<int64_t>(static_cast<double>(n) * (1 - val_fraction));
  const int64_t val_tokens = n - train_tokens;
  if (train_tokens < 1 || val_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(names, ": ", n,
                                                   " characters are too few to split at "
                                                   "val_fraction ",
                                                   val_fraction));
  }
  if (train_tokens > kMaxShardTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        names, ": ", train_tokens, " train characters; a shard holds at most ", kMaxShardTokens));
  }
  std::vector<uint16_t> id_of(chars.back() + 1, 0);
  for (size_t id = 0; id < chars.size(); ++id) id_of[chars[id]] = static_cast<uint16_t>(id);

  KILN_ASSIGN_OR_RETURN(
      std::unique_ptr<AtomicFileWriter> train,
      AtomicFileWriter::Open(absl::StrCat(dir, "/", kTokenTrainPrefix, "000.bin")));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> val,
                        AtomicFileWriter::Open(absl::StrCat(dir, "/", kTokenValPrefix, "000.bin")));
  KILN_RETURN_IF_ERROR(train->Append(TokenShardHeader(train_tokens)));
  KILN_RETURN_IF_ERROR(val->Append(TokenShardHeader(val_tokens)));
  KILN_RETURN_IF_ERROR(WriteTokens(sources, id_of, train_tokens, train.get(), val.get()));
  KILN_RETURN_IF_ERROR(train->Commit());
  KILN_RETURN_IF_ERROR(val->Commit());
  KILN_RETURN_IF_ERROR(
      WriteFileAtomically(absl::StrCat(dir, "/", kVocabularyFile), vocab.ToJson()));
  return TextCorpusFacts{std::move(vocab), train_tokens, val_tokens};
}

}  // namespace kiln
