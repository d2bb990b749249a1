#include "client/npy_writer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::client {

std::string NpyHeader(std::string_view descr, const std::vector<int64_t>& shape) {
  // A one-element tuple keeps its comma: (5,).
  const std::string dims =
      shape.size() == 1 ? absl::StrCat(shape[0], ",") : absl::StrJoin(shape, ", ");
  std::string dict = absl::StrCat("{'descr': '", std::string(descr),
                                  "', 'fortran_order': False, 'shape': (", dims, "), }");
  // 10 bytes of magic, version and length, then the dict padded with spaces to end in '\n' on a
  // 64-byte boundary.
  const size_t total = (10 + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - 10 - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string header("\x93NUMPY\x01\x00", 8);
  header.push_back(static_cast<char>(dict.size() & 0xff));
  header.push_back(static_cast<char>(dict.size() >> 8));
  return header + dict;
}

}  // namespace kiln::client
