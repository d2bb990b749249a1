// Byte counts for people: "512 B", "1.5 KiB", "8.2 GiB". One format for the CLI's tables and the
// daemon's messages.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

std::string FormatBytes(int64_t bytes);

}  // namespace kiln
