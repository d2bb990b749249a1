#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace kiln {

// Tensor bytes are stored as the host lays them out; the format requires little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

namespace {

// File order is the header's key order, so parse into an insertion-ordered object.
using Json = nlohmann::ordered_json;

constexpr char kMetadataKey[] = "__metadata__";

bool ParseDType(std::string_view name, SafetensorDType* dtype) {
  static constexpr SafetensorDType kAll[] = {SafetensorDType::kF32, SafetensorDType::kI32,
                                             SafetensorDType::kU8, SafetensorDType::kI64,
                                             SafetensorDType::kU64};
  for (SafetensorDType d : kAll) {
    if (name == SafetensorDTypeName(d)) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

// Element count times element size, or false on a negative dim or overflow.
bool CheckedByteSize(const Shape& shape, SafetensorDType dtype, uint64_t* bytes) {
  uint64_t n = SafetensorDTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *bytes = n;
  return true;
}

// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // Allowed range of the second byte.
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (s.size() - i < len) return false;
    const auto c1 = static_cast<unsigned char>(s[i + 1]);
    if (c1 < lo || c1 > hi) return false;
    for (size_t k = 2; k < len; ++k) {
      const auto ck = static_cast<unsigned char>(s[i + k]);
      if (ck < 0x80 || ck > 0xBF) return false;
    }
    i += len;
  }
  return true;
}

// What is wrong with `name` as a tensor's name, "" when nothing is: the writer's rule and the
// reader's, so that every file read can be written back.
std::string TensorNameProblem(const std::string& name) {
  if (name.empty()) return "a tensor has an empty name";
  if (name == kMetadataKey) return "a tensor may not be called \"__metadata__\"";
  if (!IsValidUtf8(name)) return "a tensor name is not valid UTF-8";
  return "";
}

// A JSON string literal. Input is valid UTF-8 (checked by the caller), so dump() cannot throw;
// `replace` makes sure of it.
std::string JsonString(std::string_view s) {
  return Json(std::string(s)).dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

// A first pass over the header that records where the JSON breaks and rejects duplicate keys,
// which a DOM parse would silently collapse to the last one.
class HeaderChecker {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(number_integer_t) { return true; }
  bool number_unsigned(number_unsigned_t) { return true; }
  bool number_float(number_float_t, const string_t&) { return true; }
  bool string(string_t&) { return true; }
  bool binary(binary_t&) { return true; }
  bool start_object(size_t) {
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) {
    if (keys_.back().insert(k).second) return true;
    duplicate_ = true;
    duplicate_key_ = k;
    return false;
  }
  bool end_object() {
    keys_.pop_back();
    return true;
  }
  bool start_array(size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception&) {
    error_position_ = position;
    return false;
  }

  bool duplicate() const { return duplicate_; }
  const std::string& duplicate_key() const { return duplicate_key_; }
  size_t error_position() const { return error_position_; }

 private:
  std::vector<std::set<std::string>> keys_;  // Keys seen in each open object, innermost last.
  bool duplicate_ = false;
  std::string duplicate_key_;
  size_t error_position_ = 0;
};

// One header entry, before the data section is sliced.
struct Entry {
  std::string name;
  SafetensorDType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

std::string JsonShape(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::StatusOr<Entry> ParseEntry(absl::string_view what, const std::string& name, const Json& value,
                                 uint64_t data_size) {
  const std::string where = absl::StrCat(what, ": tensor ", JsonString(name));
  auto invalid = [&](absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", problem));
  };
  if (!value.is_object()) return invalid("entry is not a JSON object");
  for (const auto& [field, unused] : value.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      return invalid(absl::StrCat("unknown field ", JsonString(field)));
    }
  }
  Entry entry;
  entry.name = name;

  const auto dtype_it = value.find("dtype");
  if (dtype_it == value.end()) return invalid("missing \"dtype\"");
  if (!dtype_it->is_string()) return invalid("\"dtype\" is not a string");
  const auto& dtype_name = dtype_it->get_ref<const std::string&>();
  if (!ParseDType(dtype_name, &entry.dtype)) {
    return invalid(absl::StrCat("unsupported dtype ", JsonString(dtype_name),
                                " (kiln reads F32, I32, U8, I64, U64)"));
  }

  const auto shape_it = value.find("shape");
  if (shape_it == value.end()) return invalid("missing \"shape\"");
  if (!shape_it->is_array()) return invalid("\"shape\" is not an array");
  for (const Json& dim : *shape_it) {
    if (!dim.is_number_integer()) return invalid("\"shape\" holds a value that is not an integer");
    if (!dim.is_number_unsigned() && dim.get<int64_t>() < 0) {
      return invalid(absl::StrCat("negative dim ", dim.get<int64_t>(), " in \"shape\""));
    }
    const auto d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return invalid(absl::StrCat("dim ", d, " in \"shape\" is too large"));
    }
    entry.shape.push_back(static_cast<int64_t>(d));
  }

  const auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end()) return invalid("missing \"data_offsets\"");
  if (!offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return invalid("\"data_offsets\" is not an array of two non-negative integers");
  }
  entry.begin = (*offsets_it)[0].get<uint64_t>();
  entry.end = (*offsets_it)[1].get<uint64_t>();
  const std::string offsets = absl::StrCat("[", entry.begin, ",", entry.end, "]");
  if (entry.end < entry.begin) {
    return invalid(absl::StrCat("\"data_offsets\" ", offsets, " end before they begin"));
  }
  uint64_t bytes = 0;
  if (!CheckedByteSize(entry.shape, entry.dtype, &bytes)) {
    return invalid(absl::StrCat("shape ", JsonShape(entry.shape), " overflows"));
  }
  if (bytes != entry.end - entry.begin) {
    return invalid(absl::StrCat("shape ", JsonShape(entry.shape), " of ", dtype_name, " needs ",
                                bytes, " bytes but \"data_offsets\" ", offsets, " hold ",
                                entry.end - entry.begin));
  }
  if (entry.end > data_size) {
    return absl::DataLossError(absl::StrCat(where, ": \"data_offsets\" ", offsets,
                                            " run past the data section of ", data_size,
                                            " bytes (file truncated?)"));
  }
  return entry;
}

// The header text for `tensors`, padded with spaces to a multiple of 8 bytes. Field order follows
// the reference writer: "__metadata__" first, then each tensor's dtype, shape, data_offsets.
absl::StatusOr<std::string> BuildHeader(const std::string& path,
                                        const std::vector<HostTensor>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  auto invalid = [&](absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat("writing ", path, ": ", problem));
  };
  std::string header = "{";
  if (!metadata.empty()) {
    absl::StrAppend(&header, "\"", kMetadataKey, "\":{");
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
        return invalid("a metadata key or value is not valid UTF-8");
      }
      absl::StrAppend(&header, first ? "" : ",", JsonString(key), ":", JsonString(value));
      first = false;
    }
    header += "}";
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const HostTensor& t : tensors) {
    if (const std::string problem = TensorNameProblem(t.name); !problem.empty()) {
      return invalid(problem);
    }
    const std::string name = JsonString(t.name);
    if (!names.insert(t.name).second) return invalid(absl::StrCat("duplicate tensor ", name));
    uint64_t bytes = 0;
    if (!CheckedByteSize(t.shape, t.dtype, &bytes)) {
      return invalid(absl::StrCat("tensor ", name, ": bad shape ", JsonShape(t.shape)));
    }
    if (bytes != t.bytes.size()) {
      return invalid(absl::StrCat("tensor ", name, ": shape ", JsonShape(t.shape), " of ",
                                  SafetensorDTypeName(t.dtype), " needs ", bytes, " bytes, has ",
                                  t.bytes.size()));
    }
    absl::StrAppend(&header, header.size() > 1 ? "," : "", name, ":{\"dtype\":\"",
                    SafetensorDTypeName(t.dtype), "\",\"shape\":", JsonShape(t.shape),
                    ",\"data_offsets\":[", offset, ",", offset + bytes, "]}");
    offset += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

}  // namespace

size_t SafetensorDTypeSize(SafetensorDType dtype) {
  switch (dtype) {
    case SafetensorDType::kF32:
    case SafetensorDType::kI32:
      return 4;
    case SafetensorDType::kU8:
      return 1;
    case SafetensorDType::kI64:
    case SafetensorDType::kU64:
      return 8;
  }
  return 0;
}

const char* SafetensorDTypeName(SafetensorDType dtype) {
  switch (dtype) {
    case SafetensorDType::kF32:
      return "F32";
    case SafetensorDType::kI32:
      return "I32";
    case SafetensorDType::kU8:
      return "U8";
    case SafetensorDType::kI64:
      return "I64";
    case SafetensorDType::kU64:
      return "U64";
  }
  return "?";
}

SafetensorDType ToSafetensorDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return SafetensorDType::kF32;
    case DType::kI32:
      return SafetensorDType::kI32;
    case DType::kU8:
      return SafetensorDType::kU8;
  }
  return SafetensorDType::kF32;
}

HostTensor HostTensorFromF32(std::string name, const float* data, const Shape& shape) {
  HostTensor t{std::move(name), SafetensorDType::kF32, shape, {}};
  uint64_t bytes = 0;
  // A bad shape leaves `bytes` empty; WriteSafetensors then rejects the tensor by name.
  if (CheckedByteSize(shape, t.dtype, &bytes) && bytes > 0 && data != nullptr) {
    const auto* p = reinterpret_cast<const uint8_t*>(data);
    t.bytes.assign(p, p + bytes);
  }
  return t;
}

HostTensor HostTensorFromU64(std::string name, const std::vector<uint64_t>& values) {
  HostTensor t{std::move(name), SafetensorDType::kU64, {static_cast<int64_t>(values.size())}, {}};
  const auto* p = reinterpret_cast<const uint8_t*>(values.data());
  t.bytes.assign(p, p + values.size() * sizeof(uint64_t));
  return t;
}

HostTensor HostTensorFromI64(std::string name, const std::vector<int64_t>& values) {
  HostTensor t{std::move(name), SafetensorDType::kI64, {static_cast<int64_t>(values.size())}, {}};
  const auto* p = reinterpret_cast<const uint8_t*>(values.data());
  t.bytes.assign(p, p + values.size() * sizeof(int64_t));
  return t;
}

absl::Status CopyF32(const HostTensor& tensor, const Shape& shape, float* out) {
  if (tensor.dtype != SafetensorDType::kF32 || tensor.shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", JsonString(tensor.name), " is ", SafetensorDTypeName(tensor.dtype),
                     " ", JsonShape(tensor.shape), ", expected F32 ", JsonShape(shape)));
  }
  uint64_t bytes = 0;
  if (!CheckedByteSize(shape, SafetensorDType::kF32, &bytes) || bytes != tensor.bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", JsonString(tensor.name), " holds ",
                                                   tensor.bytes.size(), " bytes, not the ", bytes,
                                                   " its shape needs"));
  }
  if (bytes > 0) std::memcpy(out, tensor.bytes.data(), bytes);
  return absl::OkStatus();
}

namespace {

template <typename T>
absl::StatusOr<std::vector<T>> ToValues(const HostTensor& tensor, SafetensorDType dtype) {
  if (tensor.dtype != dtype || tensor.bytes.size() % sizeof(T) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", JsonString(tensor.name), " is ",
                                                   SafetensorDTypeName(tensor.dtype), ", expected ",
                                                   SafetensorDTypeName(dtype)));
  }
  std::vector<T> values(tensor.bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), tensor.bytes.data(), tensor.bytes.size());
  return values;
}

}  // namespace

int SafetensorsTempWriterPid(std::string_view file_name) {
  return AtomicFileTempWriterPid(absl::string_view(file_name.data(), file_name.size()));
}

absl::StatusOr<std::vector<uint64_t>> ToU64Values(const HostTensor& tensor) {
  return ToValues<uint64_t>(tensor, SafetensorDType::kU64);
}

absl::StatusOr<std::vector<int64_t>> ToI64Values(const HostTensor& tensor) {
  return ToValues<int64_t>(tensor, SafetensorDType::kI64);
}

const HostTensor* SafetensorsContents::Find(std::string_view name) const {
  for (const HostTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<SafetensorsContents> ParseSafetensors(std::string_view bytes,
                                                     std::string_view what) {
  // Debian's Abseil has its own string_view; StrCat takes only that.
  const absl::string_view source(what.data(), what.size());
  auto invalid = [&](absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", problem));
  };
  auto data_loss = [&](absl::string_view problem) {
    return absl::DataLossError(absl::StrCat(source, ": ", problem));
  };
  if (bytes.size() < 8) {
    return data_loss(
        absl::StrCat("file is ", bytes.size(), " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  const uint64_t after_length = bytes.size() - 8;
  if (header_size > after_length) {
    return data_loss(absl::StrCat("header length ", header_size, " exceeds the ", after_length,
                                  " bytes that follow it (file truncated?)"));
  }
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return invalid(absl::StrCat("header length ", header_size, " is over the limit of ",
                                kMaxSafetensorsHeaderBytes));
  }
  const std::string_view header = bytes.substr(8, header_size);
  const std::string_view data = bytes.substr(8 + header_size);
  if (header.empty() || header.front() != '{') {
    return invalid("header does not start with '{'");
  }

  HeaderChecker checker;
  if (!Json::sax_parse(header.begin(), header.end(), &checker)) {
    if (checker.duplicate()) {
      return invalid(
          absl::StrCat("duplicate key ", JsonString(checker.duplicate_key()), " in header"));
    }
    return invalid(
        absl::StrCat("header is not valid JSON (error at byte ", checker.error_position(), ")"));
  }
  const Json root = Json::parse(header.begin(), header.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid("header is not valid JSON");
  if (!root.is_object()) return invalid("header is not a JSON object");

  SafetensorsContents contents;
  std::vector<Entry> entries;
  entries.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) return invalid("\"__metadata__\" is not a JSON object");
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return invalid(
              absl::StrCat("\"__metadata__\" value for ", JsonString(mkey), " is not a string"));
        }
        contents.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    if (const std::string problem = TensorNameProblem(key); !problem.empty()) {
      return invalid(problem);
    }
    KILN_ASSIGN_OR_RETURN(Entry entry, ParseEntry(source, key, value, data.size()));
    entries.push_back(std::move(entry));
  }

  // Tensors must tile the data section exactly: sorted by offset, each starts where the last
  // ended. Stable sort keeps header order among zero-size tensors at the same offset.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin != expected) {
      const std::string after = previous ? absl::StrCat("tensor ", JsonString(previous->name),
                                                        ", which ends at ", expected)
                                         : std::string("the start of the data section");
      return invalid(absl::StrCat("tensor ", JsonString(e.name), " at data_offsets [", e.begin, ",",
                                  e.end, "] ",
                                  e.begin < expected ? "overlaps " : "leaves a gap after ", after));
    }
    expected = e.end;
    previous = &e;
  }
  if (expected != data.size()) {
    return data_loss(absl::StrCat("data section is ", data.size(), " bytes but the tensors cover ",
                                  expected, expected < data.size() ? " (trailing bytes)" : ""));
  }

  contents.tensors.reserve(entries.size());
  for (Entry& e : entries) {
    const auto* p = reinterpret_cast<const uint8_t*>(data.data()) + e.begin;
    contents.tensors.push_back(HostTensor{std::move(e.name), e.dtype, std::move(e.shape),
                                          std::vector<uint8_t>(p, p + (e.end - e.begin))});
  }
  return contents;
}

absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": open"));
  }
  std::string bytes;
  absl::Status status = [&]() -> absl::Status {
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      return absl::ErrnoToStatus(err, absl::StrCat(path, ": fstat"));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
    }
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        return absl::ErrnoToStatus(err, absl::StrCat(path, ": read"));
      }
      if (n == 0) {
        return absl::DataLossError(absl::StrCat(path, ": file shrank while being read (", done,
                                                " of ", bytes.size(), " bytes)"));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }();
  ::close(fd);
  KILN_RETURN_IF_ERROR(status);
  return ParseSafetensors(bytes, path);
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<HostTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  KILN_ASSIGN_OR_RETURN(const std::string header, BuildHeader(path, tensors, metadata));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> file, AtomicFileWriter::Open(path));
  uint8_t length[8];
  const uint64_t header_size = header.size();
  std::memcpy(length, &header_size, 8);
  KILN_RETURN_IF_ERROR(file->Append(absl::string_view(reinterpret_cast<char*>(length), 8)));
  KILN_RETURN_IF_ERROR(file->Append(header));
  for (const HostTensor& t : tensors) {
    KILN_RETURN_IF_ERROR(file->Append(
        absl::string_view(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size())));
  }
  return file->Commit();
}

}  // namespace kiln
