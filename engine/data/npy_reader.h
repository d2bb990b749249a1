// A reader for NumPy .npy arrays (format versions 1-3): C order, little endian; uint8 or float32
// samples and uint8, int32 or int64 labels, as a dataset folder of train_x.npy, train_y.npy and
// optionally test_x.npy, test_y.npy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/data/dataset.h"

namespace kiln {

inline constexpr char kNpyTrainX[] = "train_x.npy";
inline constexpr char kNpyTrainY[] = "train_y.npy";
inline constexpr char kNpyTestX[] = "test_x.npy";
inline constexpr char kNpyTestY[] = "test_y.npy";
// A header longer than this is not one numpy writes.
inline constexpr size_t kMaxNpyHeaderBytes = 64 << 10;

// What an .npy header says.
struct NpyHeader {
  char kind = 0;  // 'u' (uint8), 'f' (float32) or 'i' (int32, int64)
  int item_bytes = 0;
  std::vector<int64_t> shape;
  int64_t data_offset = 0;  // bytes before the data
  int64_t elements() const;
};

// Checks an .npy file's bytes as they stream past: the header (magic, version, dtype, order,
// shape), then exactly the data it announces; with `labels`, a rank-1 integer array whose values
// are class ids 0..65535; float32 samples must be finite. Errors name the file: InvalidArgument for a header or dtype refused,
// DataLoss for short or overlong data. Not thread-safe.
class NpyStreamCheck {
 public:
  enum class Role { kSamples, kLabels };
  NpyStreamCheck(std::string name, Role role) : name_(std::move(name)), role_(role) {}
  absl::Status Consume(std::string_view bytes);
  absl::Status Finish() const;
  // Valid once the header has been read.
  const NpyHeader& header() const { return header_; }
  int max_label() const { return max_label_; }

 private:
  absl::Status ParseHeader();
  std::string name_;
  Role role_;
  std::string head_;
  bool header_done_ = false;
  NpyHeader header_;
  int64_t data_bytes_ = 0;
  std::string partial_;  // a label split across pieces
  int max_label_ = -1;
};

// Loads a folder of train_x.npy, train_y.npy (and test_x.npy, test_y.npy together). uint8
// samples of shape (N, ...) become pixels of sample shape (...), e.g. (N, 3, 32, 32) or
// (N, 28, 28); float32 samples must be a (N, F) table (F <= 256) and become float features,
// standardised like a CSV table's. Errors name the file and the problem.
absl::StatusOr<DatasetSplits> LoadNpyFolder(const std::string& dir);

// Parses the two arrays of one split already in memory.
absl::StatusOr<Dataset> ParseNpySplit(std::string_view x, const std::string& x_name,
                                      std::string_view y, const std::string& y_name);

}  // namespace kiln
