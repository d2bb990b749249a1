// The header of a NumPy .npy file (format 1.0), for arrays kiln builds itself and uploads as
// --format npy does: image folders decoded on the client.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::client {

// The magic, version and header dict of a C-order array of dtype `descr` ("|u1", "<i4") and
// `shape`, padded to a multiple of 64 bytes as numpy writes it; the data follows it as is.
std::string NpyHeader(std::string_view descr, const std::vector<int64_t>& shape);

}  // namespace kiln::client
