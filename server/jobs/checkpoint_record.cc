#include "server/jobs/checkpoint_record.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "server/checkpoints/checkpoint_policy.h"
#include "server/jobs/job_vocabulary.h"
#include "server/jobs/proto_time.h"

namespace kiln::server {
namespace fs = std::filesystem;

std::string NewCheckpointPath(const std::string& state_dir, const std::string& job_id,
                              v1::CheckpointKind kind, int64_t global_step) {
  const std::string dir = absl::StrCat(state_dir, "/checkpoints/", job_id);
  std::error_code ec;
  fs::create_directories(dir, ec);
  return absl::StrCat(dir, "/", CheckpointKindName(kind), "-step", global_step, "-", NowMillis(),
                      ".safetensors");
}

absl::StatusOr<v1::Checkpoint> RecordCheckpoint(JobSlot* slot, std::mutex* mu, JobStore* store,
                                                JobEvents* events, const std::string& path,
                                                const CheckpointFacts& facts) {
  v1::Checkpoint c;
  c.set_kind(facts.kind);
  c.set_epochs_done(facts.epochs_done);
  c.set_global_step(facts.global_step);
  std::error_code ec;
  c.set_size_bytes(static_cast<int64_t>(fs::file_size(path, ec)));
  KILN_ASSIGN_OR_RETURN(const std::string sha256, Sha256OfFile(path));
  c.set_sha256(sha256);
  *c.mutable_create_time() = MillisToTimestamp(NowMillis());
  c.set_path(path);
  std::lock_guard<std::mutex> lock(*mu);
  c.set_job_id(slot->job.id());
  c.set_test_accuracy(slot->job.last_epoch().test_accuracy());
  KILN_RETURN_IF_ERROR(store->InsertCheckpoint(&c));
  if (slot->job.resume_checkpoint_id() != 0) {  // this run's own checkpoint is now the newest
    slot->job.set_resume_checkpoint_id(0);
    KILN_RETURN_IF_ERROR(store->PutJob(slot->job));
  }
  KILN_RETURN_IF_ERROR(
      events->CheckpointWritten(slot->job, c, facts.write_seconds, &slot->next_seq));
  // What the job's policy makes redundant now goes, row first, then file.
  const CheckpointPolicy policy(slot->job.spec().checkpoint_policy());
  absl::StatusOr<std::vector<v1::Checkpoint>> all = store->Checkpoints(slot->job.id());
  if (all.ok()) {
    for (const v1::Checkpoint& old : policy.Redundant(*all, c)) {
      if (store->DeleteCheckpoint(old.id()).ok()) fs::remove(old.path(), ec);
    }
  }
  return c;
}

}  // namespace kiln::server
