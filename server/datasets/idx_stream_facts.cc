#include "server/datasets/idx_stream_facts.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::server {

absl::Status IdxStreamFacts::Consume(absl::string_view bytes) {
  while (!header_done_ && !bytes.empty()) {
    // The first four bytes say how long the header is; ParseIdxHeader explains a bad start.
    const size_t want = head_.size() < 4 ? 4 : IdxHeaderBytes(head_);
    if (want == 0) return ParseIdxHeader(head_, name_, content_).status();
    const size_t take = std::min(want - head_.size(), bytes.size());
    head_.append(bytes.data(), take);
    bytes.remove_prefix(take);
    if (head_.size() >= 4 && IdxHeaderBytes(head_) == head_.size()) {
      absl::StatusOr<IdxHeader> header = ParseIdxHeader(head_, name_, content_);
      if (!header.ok()) return header.status();
      header_ = *std::move(header);
      header_done_ = true;
    }
  }
  if (bytes.empty()) return absl::OkStatus();
  data_bytes_ += static_cast<int64_t>(bytes.size());
  if (data_bytes_ > header_.elements) {
    return absl::DataLossError(
        absl::StrCat(name_, ": trailing bytes: header says ", absl::StrJoin(header_.dims, "x"),
                     " = ", header_.elements, " bytes of data but the ", content_, " has more"));
  }
  for (char c : bytes) max_element_ = std::max(max_element_, static_cast<int>(uint8_t(c)));
  return absl::OkStatus();
}

absl::Status IdxStreamFacts::Finish() const {
  if (!header_done_) {
    // Too short to hold a header: ParseIdxHeader names what is missing.
    return ParseIdxHeader(head_, name_, content_).status();
  }
  if (data_bytes_ < header_.elements) {
    return absl::DataLossError(
        absl::StrCat(name_, ": truncated: header says ", absl::StrJoin(header_.dims, "x"), " = ",
                     header_.elements, " bytes of data but the ", content_, " has ", data_bytes_,
                     " after the ", header_.size_bytes, "-byte header"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::server
