// A KeyValueStore in a folder, for ranks that are processes on one machine: each key is a file,
// written atomically (temp file, rename) and polled for by readers. The folder is the namespace:
// one per job and attempt, so a retried job never reads a dead attempt's addresses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/distributed/key_value_store.h"

namespace kiln {

class FileKeyValueStore final : public KeyValueStore {
 public:
  // Uses `dir`, creating it (one level) when missing. Thread-safe; any number of processes may
  // share the folder.
  static absl::StatusOr<std::unique_ptr<FileKeyValueStore>> Open(const std::string& dir);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

  const std::string& dir() const { return dir_; }

 private:
  explicit FileKeyValueStore(std::string dir) : dir_(std::move(dir)) {}
  // The file holding `key`: its bytes outside [A-Za-z0-9_-] written as %XX, so that keys with
  // slashes (Gloo's prefixes) stay one file inside the folder.
  std::string PathFor(const std::string& key) const;

  std::string dir_;
};

}  // namespace kiln
