#include "engine/data/npy_reader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engine/data/csv_reader.h"
#include "engine/data/data_file.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
constexpr std::string_view kMagic = "\x93NUMPY";
constexpr int kMaxLabel = 65535;

// The text after `'key':` in a header dict, up to (not including) the next top-level comma or
// brace; empty when the key is absent.
std::string_view DictValue(std::string_view dict, std::string_view key) {
  const std::string quoted = absl::StrCat("'", std::string(key), "'");
  size_t at = dict.find(quoted);
  if (at == std::string_view::npos) return {};
  at = dict.find(':', at + quoted.size());
  if (at == std::string_view::npos) return {};
  size_t end = at + 1;
  int depth = 0;
  for (; end < dict.size(); ++end) {
    const char c = dict[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    if (depth < 0) break;
  }
  absl::string_view v(dict.data() + at + 1, end - at - 1);
  v = absl::StripAsciiWhitespace(v);
  return std::string_view(v.data(), v.size());
}

int64_t LabelAt(const NpyHeader& h, const char* p) {
  if (h.kind == 'u') return static_cast<uint8_t>(*p);
  if (h.item_bytes == 4) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

int64_t NpyHeader::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status NpyStreamCheck::ParseHeader() {
  const auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": not a usable .npy file: ", what));
  };
  const int major = static_cast<uint8_t>(head_[6]);
  const size_t len_bytes = major == 1 ? 2 : 4;
  size_t len = 0;
  for (size_t i = 0; i < len_bytes; ++i)
    len |= size_t{static_cast<uint8_t>(head_[8 + i])} << (8 * i);
  const std::string_view dict = std::string_view(head_).substr(8 + len_bytes, len);
  const std::string_view descr = DictValue(dict, "descr");
  const std::string_view order = DictValue(dict, "fortran_order");
  const std::string_view shape = DictValue(dict, "shape");
  if (descr.empty() || order.empty() || shape.size() < 2) {
    return bad("its header lacks descr, fortran_order or shape");
  }
  if (order != "False") return bad("Fortran order; save the array in C order");
  const std::string d(descr.substr(1, descr.size() - 2));  // without the quotes
  if (d == "|u1" || d == "<u1") {
    header_.kind = 'u';
    header_.item_bytes = 1;
  } else if (d == "<f4") {
    header_.kind = 'f';
    header_.item_bytes = 4;
  } else if (d == "<i4" || d == "<i8") {
    header_.kind = 'i';
    header_.item_bytes = d == "<i4" ? 4 : 8;
  } else {
    return bad(absl::StrCat("dtype ", d,
                            " is not uint8 or little-endian float32 (samples), int32 or int64"));
  }
  int64_t elements = 1;
  for (absl::string_view part : absl::StrSplit(
           absl::string_view(shape.data() + 1, shape.size() - 2), ',', absl::SkipWhitespace())) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim <= 0 ||
        dim > std::numeric_limits<int64_t>::max() / 8 / elements) {
      return bad(absl::StrCat("shape ", std::string(shape), " is not of positive sizes"));
    }
    elements *= dim;
    header_.shape.push_back(dim);
  }
  if (header_.shape.empty()) return bad("a scalar, not an array of samples");
  if (role_ == Role::kLabels) {
    if (header_.shape.size() != 1 || header_.kind == 'f') {
      return bad(absl::StrCat("labels must be a rank-1 uint8, int32 or int64 array; this is ", d,
                              " of shape ", std::string(shape)));
    }
  } else if (header_.kind == 'i') {
    return bad(absl::StrCat("samples must be uint8 or float32, not ", d));
  } else if (header_.kind == 'f' && header_.shape.size() != 2) {
    return bad(absl::StrCat("float32 samples must be a (N, F) table; this is of shape ",
                            std::string(shape)));
  }
  header_.data_offset = static_cast<int64_t>(8 + len_bytes + len);
  return absl::OkStatus();
}

absl::Status NpyStreamCheck::Consume(std::string_view bytes) {
  while (!header_done_ && !bytes.empty()) {
    // 6 magic bytes, 2 of version, then 2 (version 1) or 4 bytes of header length.
    size_t want = 12;
    if (head_.size() >= 8) {
      if (head_.compare(0, 6, kMagic) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name_, ": not an .npy file (no \\x93NUMPY)"));
      }
      const int major = static_cast<uint8_t>(head_[6]);
      if (major < 1 || major > 3) {
        return absl::InvalidArgumentError(
            absl::StrCat(name_, ": .npy format version ", major, " is not 1, 2 or 3"));
      }
      const size_t len_bytes = major == 1 ? 2 : 4;
      if (head_.size() >= 8 + len_bytes) {
        size_t len = 0;
        for (size_t i = 0; i < len_bytes; ++i) {
          len |= size_t{static_cast<uint8_t>(head_[8 + i])} << (8 * i);
        }
        if (len > kMaxNpyHeaderBytes) {
          return absl::InvalidArgumentError(
              absl::StrCat(name_, ": .npy header of ", len, " bytes is too long"));
        }
        want = 8 + len_bytes + len;
      } else {
        want = 8 + len_bytes;
      }
    }
    const size_t take = std::min(want - head_.size(), bytes.size());
    head_.append(bytes.data(), take);
    bytes.remove_prefix(take);
    if (head_.size() == want && want > 12) {
      KILN_RETURN_IF_ERROR(ParseHeader());
      header_done_ = true;
    }
  }
  if (bytes.empty()) return absl::OkStatus();
  const int64_t expected = header_.elements() * header_.item_bytes;
  if (data_bytes_ + static_cast<int64_t>(bytes.size()) > expected) {
    return absl::DataLossError(absl::StrCat(name_, ": trailing bytes: shape (",
                                            absl::StrJoin(header_.shape, ", "), ") is ", expected,
                                            " bytes of data but the file has more"));
  }
  data_bytes_ += static_cast<int64_t>(bytes.size());
  // Labels must be class ids and float samples finite (a NaN would fail every job later); uint8
  // pixels are any byte.
  const bool floats = role_ == Role::kSamples && header_.kind == 'f';
  if (role_ != Role::kLabels && !floats) return absl::OkStatus();
  const size_t item = static_cast<size_t>(header_.item_bytes);
  while (!bytes.empty()) {
    const size_t take = std::min(item - partial_.size(), bytes.size());
    partial_.append(bytes.data(), take);
    bytes.remove_prefix(take);
    if (partial_.size() < item) break;
    const int64_t element =
        (data_bytes_ - static_cast<int64_t>(bytes.size())) / header_.item_bytes - 1;
    if (floats) {
      float value;
      std::memcpy(&value, partial_.data(), sizeof(value));
      if (!std::isfinite(value)) {
        return absl::InvalidArgumentError(absl::StrCat(name_, ": the value at element ", element,
                                                       " is not finite (", value,
                                                       "); float samples must be finite numbers"));
      }
      partial_.clear();
      continue;
    }
    const int64_t label = LabelAt(header_, partial_.data());
    if (label < 0 || label > kMaxLabel) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": label ", label, " at element ",
                                                     element, " is not a class id (0..", kMaxLabel,
                                                     ")"));
    }
    max_label_ = std::max(max_label_, static_cast<int>(label));
    partial_.clear();
  }
  return absl::OkStatus();
}

absl::Status NpyStreamCheck::Finish() const {
  if (!header_done_) {
    return absl::DataLossError(
        absl::StrCat(name_, ": truncated inside the .npy header (", head_.size(), " bytes)"));
  }
  const int64_t expected = header_.elements() * header_.item_bytes;
  if (data_bytes_ < expected) {
    return absl::DataLossError(absl::StrCat(name_, ": truncated: shape (",
                                            absl::StrJoin(header_.shape, ", "), ") is ", expected,
                                            " bytes of data but the file has ", data_bytes_,
                                            " after the ", header_.data_offset, "-byte header"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> ParseNpySplit(std::string_view x, const std::string& x_name,
                                      std::string_view y, const std::string& y_name) {
  NpyStreamCheck xs(x_name, NpyStreamCheck::Role::kSamples);
  KILN_RETURN_IF_ERROR(xs.Consume(x));
  KILN_RETURN_IF_ERROR(xs.Finish());
  NpyStreamCheck ys(y_name, NpyStreamCheck::Role::kLabels);
  KILN_RETURN_IF_ERROR(ys.Consume(y));
  KILN_RETURN_IF_ERROR(ys.Finish());
  const NpyHeader& hx = xs.header();
  const NpyHeader& hy = ys.header();
  if (hx.shape[0] != hy.shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat("count mismatch: ", x_name, " has ", hx.shape[0],
                                                   " samples but ", y_name, " has ", hy.shape[0],
                                                   " labels"));
  }
  if (hx.kind == 'f' && hx.shape[1] > kMaxCsvFeatures) {
    return absl::InvalidArgumentError(
        absl::StrCat(x_name, ": ", hx.shape[1], " float features; at most ", kMaxCsvFeatures));
  }
  Dataset ds;
  ds.sample_shape.assign(hx.shape.begin() + 1, hx.shape.end());
  if (ds.sample_shape.empty()) ds.sample_shape = {1};
  ds.size = hx.shape[0];
  ds.num_classes = ys.max_label() + 1;
  const char* data = x.data() + hx.data_offset;
  try {
    if (hx.kind == 'f') {
      ds.features.resize(static_cast<size_t>(hx.elements()));
      std::memcpy(ds.features.data(), data, ds.features.size() * sizeof(float));
      for (float v : ds.features) {
        if (!std::isfinite(v)) {
          return absl::InvalidArgumentError(
              absl::StrCat(x_name, ": holds a value that is not finite"));
        }
      }
    } else {
      ds.pixels.assign(data, data + hx.elements());
    }
    ds.labels.resize(static_cast<size_t>(ds.size));
    for (int64_t i = 0; i < ds.size; ++i) {
      ds.labels[i] =
          static_cast<int32_t>(LabelAt(hy, y.data() + hy.data_offset + i * hy.item_bytes));
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(x_name, ": out of memory"));
  }
  return ds;
}

namespace {

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  return ReadDataFile(path, "a .npy file", std::numeric_limits<int64_t>::max() - 1);
}

absl::StatusOr<Dataset> LoadSplit(const std::string& dir, const char* x, const char* y) {
  const std::string xp = (fs::path(dir) / x).string(), yp = (fs::path(dir) / y).string();
  KILN_ASSIGN_OR_RETURN(std::string xb, ReadWhole(xp));
  KILN_ASSIGN_OR_RETURN(std::string yb, ReadWhole(yp));
  return ParseNpySplit(xb, xp, yb, yp);
}

}  // namespace

absl::StatusOr<DatasetSplits> LoadNpyFolder(const std::string& dir) {
  std::error_code ec;
  for (const char* f : {kNpyTrainX, kNpyTrainY}) {
    if (!fs::is_regular_file(fs::path(dir) / f, ec)) {
      return absl::NotFoundError(absl::StrCat(dir, ": no ", f));
    }
  }
  DatasetSplits splits;
  KILN_ASSIGN_OR_RETURN(splits.train, LoadSplit(dir, kNpyTrainX, kNpyTrainY));
  const bool tx = fs::is_regular_file(fs::path(dir) / kNpyTestX, ec);
  const bool ty = fs::is_regular_file(fs::path(dir) / kNpyTestY, ec);
  if (tx != ty) {
    return absl::NotFoundError(absl::StrCat(dir, ": ", tx ? kNpyTestX : kNpyTestY, " without ",
                                            tx ? kNpyTestY : kNpyTestX));
  }
  if (tx) {
    KILN_ASSIGN_OR_RETURN(splits.test, LoadSplit(dir, kNpyTestX, kNpyTestY));
    if (splits.test.sample_shape != splits.train.sample_shape ||
        splits.test.has_features() != splits.train.has_features()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": ", kNpyTestX,
                                                     " does not hold samples of ", kNpyTrainX,
                                                     "'s shape "
                                                     "and dtype"));
    }
  } else {
    splits.test.sample_shape = splits.train.sample_shape;
  }
  const int32_t classes = std::max(splits.train.num_classes, splits.test.num_classes);
  splits.train.num_classes = splits.test.num_classes = classes;
  return splits;
}

}  // namespace kiln
