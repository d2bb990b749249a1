// The one way kiln replaces a file: readers see the old content or the new, never a part, and
// the new content survives a crash once Commit returns. Checkpoints, the served TLS copies,
// dataset uploads and the client's export all write through it.
//
// The bytes go to PATH.tmp.<pid>.<16 hex> in PATH's directory (unique across processes and
// threads writing the same PATH); Commit fsyncs and closes it, renames it over PATH and fsyncs
// the directory. Until the rename PATH is untouched; a writer dropped before Commit, or one
// whose Commit failed before the rename, removes its temp file. Errors name PATH, the step
// ("open", "write", "fsync", "close", "rename", "fsync directory") and strerror, with the errno's
// status code (NotFound for a missing directory, PermissionDenied, ...).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

class AtomicFileWriter {
 public:
  // Creates the temp file with `mode` (before the umask).
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Open(const std::string& path,
                                                                mode_t mode = 0644);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  absl::Status Append(absl::string_view data);
  // Publishes the file at PATH. Call once; after a failure the writer is spent. A failed fsync
  // of the directory is reported too, with the new file already in place.
  absl::Status Commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }

 private:
  AtomicFileWriter(std::string path, std::string temp, int fd)
      : path_(std::move(path)), temp_(std::move(temp)), fd_(fd) {}
  absl::Status Fail(int err, absl::string_view step, absl::string_view target);

  std::string path_;
  std::string temp_;
  int fd_;
  bool renamed_ = false;
};

// Open, Append(content), Commit.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view content,
                                 mode_t mode = 0644);

// fsyncs a directory, making renames and creations in it durable; errors name `dir`.
absl::Status SyncDirectory(const std::string& dir);

// The pid of the writer that left `file_name` (a bare name or a path), when it is one of
// AtomicFileWriter's temp files, else -1; lets a restarted daemon delete the temp files of dead
// writers and leave live ones alone.
int AtomicFileTempWriterPid(absl::string_view file_name);

}  // namespace kiln
