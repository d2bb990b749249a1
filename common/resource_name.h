// The rule for the names clients give datasets and jobs: 1..64 of [A-Za-z0-9._-], not starting
// with '.', so that a name is always one safe path component.
#pragma once

#include <string>

namespace kiln {

bool IsValidName(const std::string& name);

}  // namespace kiln
