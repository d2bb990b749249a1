#include "engine/distributed/file_key_value_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"

namespace kiln {

namespace {

// Readers poll: short sleeps at first (rendezvous is usually quick on one machine), then
// at most this long between looks.
constexpr absl::Duration kFirstPoll = absl::Milliseconds(1);
constexpr absl::Duration kMaxPoll = absl::Milliseconds(20);

// The file's content; NotFound while it does not exist.
absl::StatusOr<std::string> ReadIfPresent(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return absl::NotFoundError(path);
    return absl::UnavailableError(
        absl::StrCat("key-value store: cannot read ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileKeyValueStore>> FileKeyValueStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("key-value store: empty folder name");
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("key-value store: cannot create ", dir, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("key-value store: ", dir, " is not a folder"));
  }
  return std::unique_ptr<FileKeyValueStore>(new FileKeyValueStore(dir));
}

std::string FileKeyValueStore::PathFor(const std::string& key) const {
  std::string name;
  for (unsigned char c : key) {
    const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       c == '_' || c == '-';
    if (plain) {
      name += static_cast<char>(c);
    } else {
      absl::StrAppend(&name, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return absl::StrCat(dir_, "/", name.empty() ? "%" : name);
}

absl::Status FileKeyValueStore::Set(const std::string& key, const std::string& value) {
  absl::Status s = WriteFileAtomically(PathFor(key), value, 0600);
  if (!s.ok())
    return absl::UnavailableError(absl::StrCat("key-value store: set ", key, ": ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileKeyValueStore::Get(const std::string& key, absl::Duration timeout) {
  KILN_RETURN_IF_ERROR(Wait({key}, timeout));
  return ReadIfPresent(PathFor(key));
}

absl::Status FileKeyValueStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = kFirstPoll;
  std::vector<std::string> missing = keys;
  while (true) {
    std::vector<std::string> still;
    for (const std::string& key : missing) {
      struct stat st;
      if (::stat(PathFor(key).c_str(), &st) != 0) still.push_back(key);
    }
    if (still.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("key-value store ", dir_, ": after ",
                                                      absl::FormatDuration(timeout), " still no ",
                                                      absl::StrJoin(still, ", ")));
    }
    missing = std::move(still);
    absl::SleepFor(std::min(pause, deadline - absl::Now()));
    pause = std::min(pause * 2, kMaxPoll);
  }
}

}  // namespace kiln
