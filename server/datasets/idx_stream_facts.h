// Checks an IDX file's (decompressed) bytes as they stream past, keeping only what a dataset's
// facts need: the dimensions and the largest element. Nothing of the data is kept, so checking a
// file costs the same little memory whatever its size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/idx_header.h"

namespace kiln::server {

class IdxStreamFacts {
 public:
  // `name` prefixes every error (a file name); `content` says what byte counts in them refer to
  // ("file", content_).
  IdxStreamFacts(std::string name, std::string content)
      : name_(std::move(name)), content_(std::move(content)) {}

  // The next bytes. The header errors are ParseIdxHeader's; bytes beyond what the header
  // announces are DataLoss at once.
  absl::Status Consume(absl::string_view bytes);
  // DataLoss when the header or the data is short.
  absl::Status Finish() const;

  // Valid after a successful Finish.
  const std::vector<int64_t>& dims() const { return header_.dims; }
  // The largest element (labels: the largest label); -1 for no data.
  int max_element() const { return max_element_; }

 private:
  std::string name_;
  std::string content_;
  std::string head_;  // the header's bytes until it is complete
  bool header_done_ = false;
  IdxHeader header_;
  int64_t data_bytes_ = 0;
  int max_element_ = -1;
};

}  // namespace kiln::server
