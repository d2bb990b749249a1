// One attempt of a job of several workers (kiln-worker processes), as kilnd's Workers service
// and the runner of the job (worker_job_runner.h) share it: which ranks have joined (each with
// its rank token) and when each was last heard from, the attempt's rendezvous keys and waits
// (within WorkerLimits), the commands waiting for rank 0, the checkpoint being handed over, and
// how each rank ended. The service calls in with what workers send; the runner watches the
// state and decides. WorkerRegistry finds an attempt by job and checks the job's worker token.
// No gRPC here.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kiln/v1/worker.pb.h"

namespace kiln::server {

// How one rank of the attempt stands.
enum class RankState { kWaiting, kJoined, kReporting, kDone, kFailed };

// What kilnd allows the workers of a job (kilnd's --max_rendezvous_* flags): a worker holds the
// job's token, not kilnd's trust, and must not exhaust kilnd.
struct WorkerLimits {
  // Rendezvous waits (GetKey) of one job open at once; more are ResourceExhausted. A rank waits
  // for one key at a time, and a job has at most 64 ranks.
  int max_key_waiters_per_job = 256;
  // Bytes of rendezvous keys and values one attempt may hold, and all attempts together. Gloo's
  // addresses and NCCL's unique id take a few KiB a job.
  int64_t max_key_bytes_per_job = int64_t{16} << 20;
  int64_t max_key_bytes = int64_t{256} << 20;
};

// The bytes of rendezvous keys all attempts hold, against kilnd's budget
// (WorkerLimits::max_key_bytes). Thread-safe.
class KeyBytesBudget {
 public:
  explicit KeyBytesBudget(int64_t max_bytes) : max_bytes_(max_bytes) {}
  // Takes `bytes` when they fit the budget; false, and nothing taken, when they do not.
  bool Take(int64_t bytes);
  void Give(int64_t bytes);
  int64_t max_bytes() const { return max_bytes_; }

 private:
  const int64_t max_bytes_;
  std::mutex mu_;
  int64_t held_ = 0;  // guarded
};

class WorkerAttempt {
 public:
  struct Hooks {
    // A report of `rank` (steps and epochs), on the service's thread; an error ends the attempt.
    std::function<absl::Status(int rank, const v1::WorkerReport& report)> on_report;
    // Rank 0 is about to hand over a checkpoint: whether the run would write one so (its kind
    // and position), and the most bytes its file may have. Before any byte is taken.
    std::function<absl::StatusOr<int64_t>(const v1::WriteCheckpointHeader& header)>
        admit_checkpoint;
    // Rank 0 handed over a checkpoint file at `path` (digest checked): check that it is one of
    // the job's model where the header says, and record it as the job's.
    std::function<absl::StatusOr<v1::Checkpoint>(const v1::WriteCheckpointHeader& header,
                                                 const std::string& path)>
        record_checkpoint;
  };

  // Called once with a rendezvous key's value, or with why there is none.
  using KeyReady = std::function<void(absl::StatusOr<std::string> value)>;

  // `join` is what JoinJob answers every rank, less its device (devices[rank]) and, for ranks
  // other than 0, resume_from. `shared_budget` (not owned; null for none) counts the bytes of
  // every attempt's keys; it must outlive the attempt.
  WorkerAttempt(std::string job_id, v1::JoinJobResponse join, std::vector<std::string> devices,
                Hooks hooks, WorkerLimits limits = {}, KeyBytesBudget* shared_budget = nullptr);
  ~WorkerAttempt();
  WorkerAttempt(const WorkerAttempt&) = delete;
  WorkerAttempt& operator=(const WorkerAttempt&) = delete;

  const std::string& job_id() const { return job_id_; }
  int world_size() const { return join_.world_size(); }
  int attempt() const { return join_.attempt(); }
  const std::string& dataset() const { return join_.dataset(); }
  // Whether `checkpoint_id` is the one this attempt starts from (ReadCheckpoint's check).
  bool StartsFrom(int64_t checkpoint_id) const {
    return checkpoint_id != 0 && checkpoint_id == join_.resume_from().id();
  }

  // --- what the Workers service calls ---
  // FailedPrecondition when the rank has joined already or the attempt has ended. The answer
  // carries the rank's rank_token, which no other rank and no other attempt has.
  absl::StatusOr<v1::JoinJobResponse> Join(int rank, const std::string& host);
  // OK when `rank_token` is what Join handed to `rank`: Unauthenticated otherwise (a worker that
  // did not join as that rank, or joined another attempt).
  absl::Status CheckRankToken(int rank, const std::string& rank_token);
  // Rank 0 begins handing over a checkpoint: the header's rank token must be rank 0's, rank 0
  // still training, no other hand-over open (ResourceExhausted), and the runner must admit it
  // (Hooks::admit_checkpoint). The most bytes the file may have; EndCheckpoint must follow.
  absl::StatusOr<int64_t> BeginCheckpoint(const v1::WriteCheckpointHeader& header);
  void EndCheckpoint();
  // ResourceExhausted, naming the flag, when the key would take the job's keys past
  // limits.max_key_bytes_per_job or every job's past the shared budget.
  absl::Status SetKey(const std::string& key, const std::string& value);
  // Waits up to `timeout` for the key, or until the attempt ends (Aborted); a wait as
  // WaitForKey's, holding the calling thread.
  absl::StatusOr<std::string> GetKey(const std::string& key, absl::Duration timeout);
  // Calls `ready` once, never under the attempt's lock: with the key's value when it is set (at
  // once, on this thread, when it is set already), or Aborted when the attempt fails or ends.
  // Returns the wait's id for CancelKeyWait (0 when `ready` has run already); ResourceExhausted,
  // and `ready` never called, when the job has limits.max_key_waiters_per_job waits open.
  absl::StatusOr<int64_t> WaitForKey(const std::string& key, KeyReady ready);
  // Drops wait `id` (its call timed out or went away) and frees its place; the attempt does not
  // call its `ready` once this returns, unless it was running it already.
  void CancelKeyWait(int64_t id);
  // A report arrived from `rank`: hello, step, epoch, keep-alive, done or failed. An error (a
  // report out of order, a failing hook) fails the attempt and is answered to the worker.
  absl::Status Report(int rank, const v1::WorkerReport& report);
  // The report stream of `rank` ended (a worker that ends it before done or failed has died).
  void StreamEnded(int rank);
  // The next command for `rank`, waiting up to `wait`; nullopt when none came or the attempt
  // ended (then ended() is true).
  std::optional<v1::WorkerCommand> NextCommand(int rank, absl::Duration wait);
  absl::StatusOr<v1::Checkpoint> RecordCheckpoint(const v1::WriteCheckpointHeader& header,
                                                  const std::string& path);

  // --- what the runner calls ---
  // Queues a command for rank 0 (the others hear it from rank 0's broadcast).
  void Command(v1::WorkerCommand::Action action);
  // Fails the attempt with `why` (the first failure wins) and wakes every waiter.
  void Fail(absl::Status why);
  // Ends the attempt: waits wake, later calls from its workers are refused, its keys go (their
  // bytes back to the shared budget), and hooks already running are waited for, so that
  // whatever they reach may go once End returns.
  void End();
  // Waits up to `timeout` for a change (a join, a report, an end); false when none came.
  bool WaitForChange(absl::Duration timeout);

  struct Snapshot {
    std::vector<RankState> ranks;
    // By rank: when the rank last joined or reported (anything, a keep-alive too).
    std::vector<absl::Time> last_heard;
    absl::Status failure;  // OK unless some rank failed or Fail was called
    bool ended = false;
  };
  Snapshot State();

 private:
  // Runs `call` (a hook) unless the attempt has ended, counted so that End waits for it.
  template <typename Result, typename Call>
  Result RunHook(Call call);
  // Locked: a rank in range, or InvalidArgument.
  absl::Status CheckRankLocked(int rank) const;
  void FailLocked(absl::Status why);
  // Locked: takes the waits for `key` (null: every wait) off the list, for the caller to call
  // once it has let go of the lock.
  std::vector<KeyReady> TakeWaitsLocked(const std::string* key);
  static void Abort(std::vector<KeyReady> waits);

  const std::string job_id_;
  const v1::JoinJobResponse join_;
  const std::vector<std::string> devices_;
  const Hooks hooks_;
  const WorkerLimits limits_;
  KeyBytesBudget* const shared_budget_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RankState> ranks_;
  std::vector<std::string> rank_tokens_;  // by rank; empty until it joins
  std::vector<absl::Time> last_heard_;    // by rank (Snapshot::last_heard)
  bool checkpoint_open_ = false;          // a hand-over between Begin and EndCheckpoint
  std::map<std::string, std::string> keys_;
  int64_t key_bytes_ = 0;  // of keys_, keys and values, taken from shared_budget_
  struct KeyWait {
    std::string key;
    KeyReady ready;
  };
  std::map<int64_t, KeyWait> waits_;  // by id
  int64_t next_wait_id_ = 1;
  std::deque<v1::WorkerCommand> commands_;  // for rank 0
  absl::Status failure_;
  bool ended_ = false;
  int hooks_running_ = 0;  // calls into hooks_ that End waits for
};

// The attempts kilnd runs now, by job, and the tokens their workers present.
class WorkerRegistry {
 public:
  // `key`: 32 or more secret bytes; a job's token is HMAC-SHA256(key, job id) in hex, so it
  // survives restarts of kilnd (workers of an external job keep theirs) while the key does.
  // `limits` hold for the attempts of every job.
  explicit WorkerRegistry(std::string key, WorkerLimits limits = {});

  const WorkerLimits& limits() const { return limits_; }
  // Every attempt's keys, against limits().max_key_bytes.
  KeyBytesBudget* key_budget() { return &key_budget_; }

  // The token workers of `job_id` present.
  std::string TokenFor(const std::string& job_id) const;

  // The attempt of `job_id` now running, if `token` is the job's: Unauthenticated when it is
  // not, FailedPrecondition when the job runs no attempt now.
  absl::StatusOr<std::shared_ptr<WorkerAttempt>> Find(const std::string& job_id,
                                                      const std::string& token);

  void Add(const std::shared_ptr<WorkerAttempt>& attempt);
  void Remove(const WorkerAttempt* attempt);

  // Where local workers reach kilnd's gRPC (HOST:PORT), once the server listens. Waits up to
  // `timeout`; Unavailable when it is not known by then.
  void SetCoordinatorAddress(std::string address);
  absl::StatusOr<std::string> CoordinatorAddress(absl::Duration timeout);

 private:
  const std::string key_;
  const WorkerLimits limits_;
  KeyBytesBudget key_budget_;
  std::mutex mu_;
  std::condition_variable address_cv_;
  std::map<std::string, std::shared_ptr<WorkerAttempt>> attempts_;
  std::string address_;
};

// Reads the registry's key from `path`, creating it (32 random bytes, mode 0600) when missing.
absl::StatusOr<std::string> LoadOrCreateWorkerKey(const std::string& path);

}  // namespace kiln::server
