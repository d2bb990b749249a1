// Paths as clients are shown them: relative to the daemon's folders ("$state_dir/checkpoints/...",
// "$data_dir/mnist/...") instead of absolute paths that tell a client how the server's disk is
// laid out. Applied to every error message a client receives and to job reasons; the daemon's
// own log keeps absolute paths for its operator.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

// Sets the folders shown by name, as (absolute path, name) pairs; replaces earlier ones. Called
// once at start; thread-safe.
void SetShownPathRoots(std::vector<std::pair<std::string, std::string>> roots);

// `text` with each root (at the start of a path: followed by '/' or the end) replaced by its name.
std::string WithShownPaths(std::string_view text);

}  // namespace kiln
