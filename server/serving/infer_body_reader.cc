#include "server/serving/infer_body_reader.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json_bounds.h"

namespace kiln::serving {
namespace {

using nlohmann::json;

// Nested "data" arrays deeper than any tensor we serve are refused, not recursed into.
constexpr int kMaxDataDepth = 32;
// Values of the tree outside the inputs' data: a request needs tens (names, shapes, parameters),
// so the tree, about 16 bytes a value besides strings' own bytes, stays small whatever the body.
constexpr int64_t kMaxTreeValues = 65536;

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

// A packed "data" value is its elements in order, each a tag byte and what the tag says follows,
// then the number of number, bool and string elements as 8 bytes (to reserve the typed field).
enum Tag : uint8_t {
  kUnsigned,  // a non-negative integer: LEB128
  kSigned,    // a negative integer (or -0): LEB128 of its zigzag code
  kFloat,     // a number with a fraction or exponent: the double's 8 bytes
  kFalse,
  kTrue,
  kString,   // LEB128 length, then the bytes
  kRefused,  // a null or an object, which every datatype that keeps data refuses: LEB128
             // length, then its preview for the error. Only the first is kept, and no element
             // after it: none of them can be added or quoted.
  kTooDeep,  // an array nested deeper than kMaxDataDepth arrays; nothing follows
};

constexpr size_t kCountBytes = sizeof(uint64_t);

// Packs one "data" value from its SAX events. Each event returns whether it ended the value.
class DataPacker {
 public:
  bool Unsigned(uint64_t u) {
    if (Storing()) {
      Put(kUnsigned);
      PutVarint(u);
      ++count_;
    }
    return Ended();
  }
  bool Signed(int64_t i) {
    if (Storing()) {
      Put(kSigned);
      PutVarint((static_cast<uint64_t>(i) << 1) ^ static_cast<uint64_t>(i >> 63));
      ++count_;
    }
    return Ended();
  }
  bool Float(double d) {
    if (Storing()) {
      Put(kFloat);
      const size_t at = bytes_.size();
      bytes_.resize(at + sizeof(d));
      std::memcpy(bytes_.data() + at, &d, sizeof(d));
      ++count_;
    }
    return Ended();
  }
  bool Bool(bool b) {
    if (Storing()) {
      Put(b ? kTrue : kFalse);
      ++count_;
    }
    return Ended();
  }
  bool String(const std::string& s) {
    if (Storing()) {
      Put(kString);
      PutText(s);
      ++count_;
    }
    return Ended();
  }
  bool Null() {
    Refuse("null");
    return Ended();
  }
  bool StartArray() {
    if (skip_ > 0) {
      ++skip_;
      return false;
    }
    if (arrays_ >= kMaxDataDepth && !too_deep_) {
      Put(kTooDeep);
      too_deep_ = true;
    }
    ++arrays_;
    return false;
  }
  bool EndArray() {
    if (skip_ > 0) {
      --skip_;
      return false;
    }
    --arrays_;
    return Ended();
  }
  // An object is one element, refused; only the first one's members are counted, to quote it.
  bool StartObject() {
    if (Storing()) members_ = json::object();
    ++skip_;
    return false;
  }
  void Key(const std::string& key) {
    if (skip_ == 1 && members_.is_object()) members_[key] = nullptr;
  }
  bool EndObject() {
    if (--skip_ > 0) return false;
    if (members_.is_object()) Refuse(JsonPreview(members_));
    members_ = json();
    return Ended();
  }

  // The packed value, and the packer ready for the next one.
  json Take() {
    const size_t at = bytes_.size();
    bytes_.resize(at + kCountBytes);
    std::memcpy(bytes_.data() + at, &count_, kCountBytes);
    json packed = json::binary(std::move(bytes_));
    *this = DataPacker();
    return packed;
  }

 private:
  // Whether an element now is one to store: not within an object element, nor after a refused
  // element or too deep an array.
  bool Storing() const { return skip_ == 0 && !refused_ && !too_deep_; }
  bool Ended() const { return arrays_ == 0 && skip_ == 0; }
  void Put(Tag tag) { bytes_.push_back(tag); }
  void PutVarint(uint64_t v) {
    while (v >= 0x80) {
      bytes_.push_back(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    bytes_.push_back(static_cast<uint8_t>(v));
  }
  void PutText(absl::string_view s) {
    PutVarint(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void Refuse(absl::string_view preview) {
    if (!Storing()) return;
    Put(kRefused);
    PutText(preview);
    refused_ = true;
  }

  std::vector<uint8_t> bytes_;
  uint64_t count_ = 0;
  int arrays_ = 0;         // open arrays of the value (its own is the first)
  int skip_ = 0;           // open arrays and objects within an object element
  json members_;           // the first object element's members (nulls), while it is open
  bool refused_ = false;   // a kRefused element is stored
  bool too_deep_ = false;  // kTooDeep is stored
};

// The SAX handler of ReadInferBody: a tree as nlohmann's own parser builds it (a repeated key's
// last value wins), with each input's "data" packed by a DataPacker instead.
class InferBodyHandler {
 public:
  bool null() { return Packing() ? Packed(packer_.Null()) : Put(nullptr); }
  bool boolean(bool b) { return Packing() ? Packed(packer_.Bool(b)) : Put(b); }
  bool number_integer(int64_t i) { return Packing() ? Packed(packer_.Signed(i)) : Put(i); }
  bool number_unsigned(uint64_t u) { return Packing() ? Packed(packer_.Unsigned(u)) : Put(u); }
  bool number_float(double d, const std::string&) {
    return Packing() ? Packed(packer_.Float(d)) : Put(d);
  }
  bool string(std::string& s) { return Packing() ? Packed(packer_.String(s)) : Put(std::move(s)); }
  bool binary(json::binary_t&) {
    error_ = "binary values are not JSON text";  // only binary formats (CBOR, ...) have them
    return false;
  }
  bool start_object(size_t) {
    if (Packing()) return Packed(packer_.StartObject());
    Role role = Role::kOther;
    if (open_.empty()) {
      role = Role::kBody;
    } else if (open_.back().role == Role::kInputs) {
      role = Role::kInput;
    }
    return Open(json::object(), role);
  }
  bool key(std::string& key) {
    if (packing_) {
      packer_.Key(key);
      return true;
    }
    const Role role = open_.back().role;
    next_ = Next::kPlain;
    if (role == Role::kBody && key == "inputs") next_ = Next::kInputs;
    if (role == Role::kInput && key == "data") next_ = Next::kData;
    member_ = &(*open_.back().value)[std::move(key)];
    return true;
  }
  bool end_object() {
    if (packing_) return Packed(packer_.EndObject());
    open_.pop_back();
    return true;
  }
  bool start_array(size_t) {
    Next next;
    if (Packing(&next)) return Packed(packer_.StartArray());
    return Open(json::array(), next == Next::kInputs ? Role::kInputs : Role::kOther);
  }
  bool end_array() {
    if (packing_) return Packed(packer_.EndArray());
    open_.pop_back();
    return true;
  }
  bool parse_error(size_t, const std::string&, const json::exception& e) {
    error_ = e.what();
    return false;
  }

  json TakeTree() { return std::move(root_); }
  const std::string& error() const { return error_; }
  // The tree reached kMaxTreeValues: the parse stopped there.
  bool over_limit() const { return tree_values_ > kMaxTreeValues; }

 private:
  // What an open array or object is, for finding the inputs' "data".
  enum class Role : uint8_t { kBody, kInputs, kInput, kOther };
  // What the key just read names: the value that follows is the body's "inputs", an input's
  // "data", or anything else.
  enum class Next : uint8_t { kPlain, kInputs, kData };
  struct OpenValue {
    json* value;
    Role role;
  };

  // At each value event: whether the value belongs to a "data" value being packed (the key
  // just read may start one); `next` is what that key named, read once.
  bool Packing(Next* next = nullptr) {
    const Next named = next_;
    next_ = Next::kPlain;
    if (named == Next::kData) packing_ = true;
    if (next != nullptr) *next = named;
    return packing_;
  }
  // After the packer took an event: when the data value ended, it goes in the tree.
  bool Packed(bool ended) {
    if (!ended) return true;
    packing_ = false;
    Put(packer_.Take());
    return true;
  }
  json* Place(json&& v) {
    ++tree_values_;
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *open_.back().value;
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    *member_ = std::move(v);
    return member_;
  }
  bool Put(json&& v) {
    Place(std::move(v));
    return !over_limit();
  }
  bool Open(json&& container, Role role) {
    open_.push_back({Place(std::move(container)), role});
    return !over_limit();
  }

  json root_;
  std::vector<OpenValue> open_;  // innermost last; at most kMaxJsonDepth
  json* member_ = nullptr;       // the value of the key just read
  int64_t tree_values_ = 0;      // values put in the tree
  Next next_ = Next::kPlain;
  bool packing_ = false;
  DataPacker packer_;
  std::string error_;
};

// One element of a packed "data" value. `text` points into the packed bytes.
struct Element {
  Tag tag = kUnsigned;
  uint64_t u = 0;
  int64_t i = 0;
  double d = 0;
  absl::string_view text;
};

// Reads the elements of a packed value in order.
class PackedElements {
 public:
  explicit PackedElements(const json::binary_t& packed)
      : p_(packed.data()), end_(packed.data() + packed.size() - kCountBytes) {
    std::memcpy(&count_, end_, kCountBytes);
  }
  uint64_t count() const { return count_; }

  bool Next(Element* e) {
    if (p_ >= end_) return false;
    e->tag = static_cast<Tag>(*p_++);
    switch (e->tag) {
      case kUnsigned:
        e->u = Varint();
        break;
      case kSigned: {
        const uint64_t z = Varint();
        e->i = static_cast<int64_t>((z >> 1) ^ (~(z & 1) + 1));
        break;
      }
      case kFloat:
        std::memcpy(&e->d, p_, sizeof(e->d));
        p_ += sizeof(e->d);
        break;
      case kString:
      case kRefused: {
        const uint64_t n = Varint();
        e->text = absl::string_view(reinterpret_cast<const char*>(p_), n);
        p_ += n;
        break;
      }
      case kFalse:
      case kTrue:
      case kTooDeep:
        break;
    }
    return true;
  }

 private:
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const uint8_t b = *p_++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
  }

  const uint8_t* p_;
  const uint8_t* end_;
  uint64_t count_ = 0;
};

// An element as an error quotes it: as the JSON text of its value, or a null's or object's
// preview.
std::string Preview(const Element& e) {
  switch (e.tag) {
    case kUnsigned:
      return JsonPreview(json(e.u));
    case kSigned:
      return JsonPreview(json(e.i));
    case kFloat:
      return JsonPreview(json(e.d));
    case kFalse:
    case kTrue:
      return JsonPreview(json(e.tag == kTrue));
    case kString:
      return JsonPreview(json(std::string(e.text)));
    case kRefused:
    case kTooDeep:
      break;
  }
  return std::string(e.text);
}

// The repeated field of InferTensorContents a datatype's elements go to.
enum class Field { kNone, kFp32, kFp64, kUint, kUint64, kInt, kInt64, kBool, kBytes };

Field FieldOf(absl::string_view datatype) {
  if (datatype == "FP32") return Field::kFp32;
  if (datatype == "FP64") return Field::kFp64;
  if (datatype == "UINT8" || datatype == "UINT16" || datatype == "UINT32") return Field::kUint;
  if (datatype == "UINT64") return Field::kUint64;
  if (datatype == "INT8" || datatype == "INT16" || datatype == "INT32") return Field::kInt;
  if (datatype == "INT64") return Field::kInt64;
  if (datatype == "BOOL") return Field::kBool;
  if (datatype == "BYTES") return Field::kBytes;
  return Field::kNone;
}

// What an error says of an element `field` cannot take.
std::string Refusal(Field field, absl::string_view datatype) {
  switch (field) {
    case Field::kFp32:
    case Field::kFp64:
      return " is not a number";
    case Field::kBytes:
      return " is not a BYTES string";
    default:
      return absl::StrCat(" is not a ", datatype, " value");
  }
}

template <typename T>
bool ToNumber(const Element& e, T* out) {
  switch (e.tag) {
    case kUnsigned:
      *out = static_cast<T>(e.u);
      return true;
    case kSigned:
      *out = static_cast<T>(e.i);
      return true;
    case kFloat:
      *out = static_cast<T>(e.d);
      return true;
    default:
      return false;
  }
}

template <typename T>
bool ToInteger(const Element& e, T* out) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<T>::max());
  if (e.tag == kUnsigned && e.u <= kMax) {
    *out = static_cast<T>(e.u);
    return true;
  }
  if (e.tag == kSigned && e.i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
      (e.i < 0 || static_cast<uint64_t>(e.i) <= kMax)) {
    *out = static_cast<T>(e.i);
    return true;
  }
  return false;
}

void Reserve(Field field, uint64_t count, inference::InferTensorContents* c) {
  const int n = static_cast<int>(std::min<uint64_t>(count, std::numeric_limits<int>::max()));
  switch (field) {
    case Field::kFp32:
      return c->mutable_fp32_contents()->Reserve(n);
    case Field::kFp64:
      return c->mutable_fp64_contents()->Reserve(n);
    case Field::kUint:
      return c->mutable_uint_contents()->Reserve(n);
    case Field::kUint64:
      return c->mutable_uint64_contents()->Reserve(n);
    case Field::kInt:
      return c->mutable_int_contents()->Reserve(n);
    case Field::kInt64:
      return c->mutable_int64_contents()->Reserve(n);
    case Field::kBool:
      return c->mutable_bool_contents()->Reserve(n);
    case Field::kBytes:
      return c->mutable_bytes_contents()->Reserve(n);
    case Field::kNone:
      return;
  }
}

// Adds `e` to `field`; false when the field cannot take it.
bool Add(const Element& e, Field field, inference::InferTensorContents* c) {
  switch (field) {
    case Field::kFp32: {
      float v;
      if (!ToNumber(e, &v)) return false;
      c->add_fp32_contents(v);
      return true;
    }
    case Field::kFp64: {
      double v;
      if (!ToNumber(e, &v)) return false;
      c->add_fp64_contents(v);
      return true;
    }
    case Field::kUint: {
      uint32_t v;
      if (!ToInteger(e, &v)) return false;
      c->add_uint_contents(v);
      return true;
    }
    case Field::kUint64: {
      uint64_t v;
      if (!ToInteger(e, &v)) return false;
      c->add_uint64_contents(v);
      return true;
    }
    case Field::kInt: {
      int32_t v;
      if (!ToInteger(e, &v)) return false;
      c->add_int_contents(v);
      return true;
    }
    case Field::kInt64: {
      int64_t v;
      if (!ToInteger(e, &v)) return false;
      c->add_int64_contents(v);
      return true;
    }
    case Field::kBool:
      if (e.tag != kTrue && e.tag != kFalse) return false;
      c->add_bool_contents(e.tag == kTrue);
      return true;
    case Field::kBytes:
      if (e.tag != kString) return false;
      c->add_bytes_contents(std::string(e.text));
      return true;
    case Field::kNone:
      return true;
  }
  return true;
}

}  // namespace

absl::StatusOr<json> ReadInferBody(absl::string_view text, absl::string_view what) {
  if (absl::Status depth = CheckJsonDepth(text, what); !depth.ok()) return depth;
  InferBodyHandler handler;
  bool parsed = false;
  try {
    parsed = json::sax_parse(text.begin(), text.end(), &handler);
  } catch (const json::exception& e) {  // the handler throws none; nlohmann documents some
    return Invalid(absl::StrCat(what, " is not valid JSON: ", e.what()));
  }
  if (handler.over_limit()) {
    return Invalid(absl::StrCat(what, " holds more than ", kMaxTreeValues,
                                " values outside the inputs' \"data\" (shapes, names, parameters, "
                                "outputs): kilnd reads at most that many"));
  }
  if (!parsed) {
    if (handler.error().empty()) return Invalid(absl::StrCat(what, " is not valid JSON"));
    return Invalid(absl::StrCat(what, " is not valid JSON: ", handler.error()));
  }
  return handler.TakeTree();
}

absl::Status UnpackTensorData(const json& packed, const std::string& datatype,
                              inference::InferTensorContents* contents) {
  if (!packed.is_binary() || packed.get_binary().size() < kCountBytes) {
    return absl::InternalError("data: not a value ReadInferBody packed");
  }
  const Field field = FieldOf(datatype);
  PackedElements elements(packed.get_binary());
  Reserve(field, elements.count(), contents);
  int64_t index = 0;
  Element e;
  while (elements.Next(&e)) {
    if (e.tag == kTooDeep) return Invalid("nested deeper than 32 arrays");
    if (field == Field::kNone) continue;  // no data kept: nothing is refused either
    if (e.tag == kRefused || !Add(e, field, contents)) {
      return Invalid(absl::StrCat("data[", index, "]: ", Preview(e), Refusal(field, datatype)));
    }
    ++index;
  }
  return absl::OkStatus();
}

}  // namespace kiln::serving
