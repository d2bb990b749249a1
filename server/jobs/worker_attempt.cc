#include "server/jobs/worker_attempt.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/client_message.h"

namespace kiln::server {

bool KeyBytesBudget::Take(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > max_bytes_ - held_) return false;
  held_ += bytes;
  return true;
}

void KeyBytesBudget::Give(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  held_ -= bytes;
}

WorkerAttempt::WorkerAttempt(std::string job_id, v1::JoinJobResponse join,
                             std::vector<std::string> devices, Hooks hooks, WorkerLimits limits,
                             KeyBytesBudget* shared_budget)
    : job_id_(std::move(job_id)),
      join_(std::move(join)),
      devices_(std::move(devices)),
      hooks_(std::move(hooks)),
      limits_(limits),
      shared_budget_(shared_budget),
      ranks_(join_.world_size(), RankState::kWaiting),
      rank_tokens_(join_.world_size()),
      last_heard_(join_.world_size(), absl::InfinitePast()) {}

WorkerAttempt::~WorkerAttempt() {
  if (shared_budget_ != nullptr) shared_budget_->Give(key_bytes_);
}

template <typename Result, typename Call>
Result WorkerAttempt::RunHook(Call call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return absl::AbortedError("the attempt has ended");
    ++hooks_running_;
  }
  Result result = call();
  std::lock_guard<std::mutex> lock(mu_);
  --hooks_running_;
  cv_.notify_all();
  return result;
}

absl::Status WorkerAttempt::CheckRankLocked(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside the job's ",
                                                   ranks_.size(), " workers (0..",
                                                   ranks_.size() - 1, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JoinJobResponse> WorkerAttempt::Join(int rank, const std::string& host) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckRankLocked(rank); !s.ok()) return s;
  if (ended_ || !failure_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("attempt ", join_.attempt(), " of job ", job_id_, " has ended"));
  }
  if (ranks_[rank] != RankState::kWaiting) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " of job ", job_id_, " has joined already (another worker took it)"));
  }
  unsigned char secret[16];
  if (RAND_bytes(secret, sizeof(secret)) != 1) {
    return absl::InternalError("no random bytes for a rank token");
  }
  rank_tokens_[rank] =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(secret), sizeof(secret)));
  ranks_[rank] = RankState::kJoined;
  last_heard_[rank] = absl::Now();
  (void)host;
  cv_.notify_all();
  v1::JoinJobResponse response = join_;
  response.set_device(devices_[rank]);
  response.set_rank_token(rank_tokens_[rank]);
  if (rank != 0) response.clear_resume_from();
  return response;
}

absl::Status WorkerAttempt::CheckRankToken(int rank, const std::string& rank_token) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckRankLocked(rank); !s.ok()) return s;
  const std::string& expected = rank_tokens_[rank];
  if (expected.empty() || rank_token.size() != expected.size() ||
      CRYPTO_memcmp(rank_token.data(), expected.data(), expected.size()) != 0) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the rank token is not rank ", rank, "'s of attempt ", join_.attempt(), " of job ", job_id_,
        " (JoinJob hands it to the worker that joins as the rank)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WorkerAttempt::BeginCheckpoint(const v1::WriteCheckpointHeader& header) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_ || !failure_.ok()) {
      return absl::AbortedError(
          absl::StrCat("attempt ", join_.attempt(), " of job ", job_id_, " has ended"));
    }
    int rank = -1;
    for (int r = 0; r < static_cast<int>(rank_tokens_.size()); ++r) {
      const std::string& t = rank_tokens_[r];
      if (!t.empty() && t.size() == header.rank_token().size() &&
          CRYPTO_memcmp(t.data(), header.rank_token().data(), t.size()) == 0) {
        rank = r;
      }
    }
    if (rank < 0) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the checkpoint's rank token is not one attempt ", join_.attempt(), " of job ", job_id_,
          " handed out: only rank 0 of the running attempt hands over checkpoints"));
    }
    if (rank != 0) {
      return absl::PermissionDeniedError(absl::StrCat("only rank 0 hands over job ", job_id_,
                                                      "'s checkpoints; this is rank ", rank, "'s"));
    }
    if (ranks_[0] != RankState::kJoined && ranks_[0] != RankState::kReporting) {
      return absl::FailedPreconditionError("rank 0 has reported how it ended");
    }
    if (checkpoint_open_) {
      return absl::ResourceExhaustedError(
          "rank 0 is handing over a checkpoint already; one at a time");
    }
    checkpoint_open_ = true;
  }
  absl::StatusOr<int64_t> most =
      hooks_.admit_checkpoint
          ? RunHook<absl::StatusOr<int64_t>>([&] { return hooks_.admit_checkpoint(header); })
          : absl::StatusOr<int64_t>(absl::InternalError("the attempt takes no checkpoints"));
  if (!most.ok()) EndCheckpoint();
  return most;
}

void WorkerAttempt::EndCheckpoint() {
  std::lock_guard<std::mutex> lock(mu_);
  checkpoint_open_ = false;
}

absl::Status WorkerAttempt::SetKey(const std::string& key, const std::string& value) {
  if (key.empty() || key.size() > 512) {
    return absl::InvalidArgumentError("a rendezvous key must be 1..512 bytes");
  }
  if (value.size() > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous value of ", value.size(),
                                                   " bytes under \"", key,
                                                   "\" is over the limit of 1 MiB"));
  }
  std::vector<KeyReady> woken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return absl::AbortedError("the attempt has ended");
    auto it = keys_.find(key);
    if (keys_.size() >= 4096 && it == keys_.end()) {
      return absl::ResourceExhaustedError("the attempt holds 4096 rendezvous keys already");
    }
    // What the keys hold grows by this much (less when a value is replaced by a smaller one).
    const int64_t grow = static_cast<int64_t>(value.size()) -
                         (it == keys_.end() ? -static_cast<int64_t>(key.size())
                                            : static_cast<int64_t>(it->second.size()));
    if (grow > 0 && key_bytes_ + grow > limits_.max_key_bytes_per_job) {
      return absl::ResourceExhaustedError(
          absl::StrCat("rendezvous key \"", key, "\" would take job ", job_id_, "'s keys to ",
                       key_bytes_ + grow, " bytes, over the limit of ",
                       limits_.max_key_bytes_per_job, " a job (--max_rendezvous_bytes_per_job)"));
    }
    if (grow > 0 && shared_budget_ != nullptr && !shared_budget_->Take(grow)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("rendezvous key \"", key, "\" of job ", job_id_,
                       " does not fit: the keys of all jobs would be over kilnd's limit of ",
                       shared_budget_->max_bytes(), " bytes (--max_rendezvous_bytes)"));
    }
    if (grow < 0 && shared_budget_ != nullptr) shared_budget_->Give(-grow);
    key_bytes_ += grow;
    keys_[key] = value;
    woken = TakeWaitsLocked(&key);
    cv_.notify_all();
  }
  for (KeyReady& ready : woken) ready(value);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WorkerAttempt::WaitForKey(const std::string& key, KeyReady ready) {
  absl::StatusOr<std::string> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = keys_.find(key); it != keys_.end()) {
      now = it->second;
    } else if (ended_ || !failure_.ok()) {
      now = absl::AbortedError("the attempt has ended");
    } else if (static_cast<int>(waits_.size()) >= limits_.max_key_waiters_per_job) {
      return absl::ResourceExhaustedError(
          absl::StrCat("job ", job_id_, " has ", waits_.size(),
                       " rendezvous waits (GetKey) open already, the most one job may have "
                       "(--max_rendezvous_waiters_per_job=",
                       limits_.max_key_waiters_per_job, ")"));
    } else {
      const int64_t id = next_wait_id_++;
      waits_.emplace(id, KeyWait{key, std::move(ready)});
      return id;
    }
  }
  ready(std::move(now));
  return 0;
}

void WorkerAttempt::CancelKeyWait(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  waits_.erase(id);
}

std::vector<WorkerAttempt::KeyReady> WorkerAttempt::TakeWaitsLocked(const std::string* key) {
  std::vector<KeyReady> taken;
  for (auto it = waits_.begin(); it != waits_.end();) {
    if (key != nullptr && it->second.key != *key) {
      ++it;
      continue;
    }
    taken.push_back(std::move(it->second.ready));
    it = waits_.erase(it);
  }
  return taken;
}

void WorkerAttempt::Abort(std::vector<KeyReady> waits) {
  for (KeyReady& ready : waits) ready(absl::AbortedError("the attempt has ended"));
}

absl::StatusOr<std::string> WorkerAttempt::GetKey(const std::string& key, absl::Duration timeout) {
  struct Outcome {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<absl::StatusOr<std::string>> value;
  };
  auto outcome = std::make_shared<Outcome>();
  absl::StatusOr<int64_t> id = WaitForKey(key, [outcome](absl::StatusOr<std::string> value) {
    std::lock_guard<std::mutex> lock(outcome->mu);
    outcome->value = std::move(value);
    outcome->cv.notify_all();
  });
  if (!id.ok()) return id.status();
  std::unique_lock<std::mutex> lock(outcome->mu);
  if (!outcome->cv.wait_for(lock,
                            absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())),
                            [&] { return outcome->value.has_value(); })) {
    lock.unlock();
    CancelKeyWait(*id);
    lock.lock();
    if (!outcome->value.has_value()) {  // else the key came as the wait ran out
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous key \"", key, "\" was not set within ", absl::FormatDuration(timeout)));
    }
  }
  return *std::move(outcome->value);
}

absl::Status WorkerAttempt::Report(int rank, const v1::WorkerReport& report) {
  std::vector<KeyReady> aborted;
  absl::Cleanup abort_waits = [&] { Abort(std::move(aborted)); };  // once the lock is let go
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckRankLocked(rank); !s.ok()) return s;
    if (ended_) return absl::AbortedError("the attempt has ended");
    RankState& state = ranks_[rank];
    if (state == RankState::kJoined || state == RankState::kReporting) {
      last_heard_[rank] = absl::Now();
    }
    switch (report.report_case()) {
      case v1::WorkerReport::kKeepAlive:
        if (state != RankState::kReporting) {
          return absl::FailedPreconditionError(
              absl::StrCat("rank ", rank, " sent a keep-alive before its hello"));
        }
        return absl::OkStatus();
      case v1::WorkerReport::kHello:
        if (state != RankState::kJoined) {
          return absl::FailedPreconditionError(
              absl::StrCat("rank ", rank, " said hello before joining, or twice"));
        }
        state = RankState::kReporting;
        cv_.notify_all();
        return absl::OkStatus();
      case v1::WorkerReport::kDone:
        state = RankState::kDone;
        cv_.notify_all();
        return absl::OkStatus();
      case v1::WorkerReport::kFailed: {
        state = RankState::kFailed;
        // The worker's words become the job's reason: a known code, and cut as a client's are.
        const int code = report.failed().code();
        FailLocked(
            absl::Status(code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                             ? static_cast<absl::StatusCode>(code)
                             : absl::StatusCode::kUnknown,
                         ClientMessage(report.failed().message())));
        aborted = TakeWaitsLocked(nullptr);
        return absl::OkStatus();
      }
      case v1::WorkerReport::kStep:
      case v1::WorkerReport::kEpoch:
        if (state != RankState::kReporting) {
          return absl::FailedPreconditionError(
              absl::StrCat("rank ", rank, " reported before its hello"));
        }
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rank, " sent an empty report, or one of a kind this kilnd does not know"));
    }
  }
  // Outside the lock: the hook takes the job manager's, and waits must not stall behind it.
  if (!hooks_.on_report) return absl::OkStatus();
  absl::Status s = RunHook<absl::Status>([&] { return hooks_.on_report(rank, report); });
  if (!s.ok()) Fail(s);
  return s;
}

void WorkerAttempt::StreamEnded(int rank) {
  std::vector<KeyReady> aborted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
    if (ranks_[rank] == RankState::kDone || ranks_[rank] == RankState::kFailed) return;
    ranks_[rank] = RankState::kFailed;
    FailLocked(absl::UnavailableError(
        absl::StrCat("worker rank ", rank, " went away without reporting how it ended")));
    aborted = TakeWaitsLocked(nullptr);
  }
  Abort(std::move(aborted));
}

std::optional<v1::WorkerCommand> WorkerAttempt::NextCommand(int rank, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (rank == 0 && !commands_.empty()) {
      v1::WorkerCommand c = std::move(commands_.front());
      commands_.pop_front();
      return c;
    }
    if (ended_) return std::nullopt;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return std::nullopt;
    cv_.wait_for(lock, absl::ToChronoMilliseconds(left));
  }
}

absl::StatusOr<v1::Checkpoint> WorkerAttempt::RecordCheckpoint(
    const v1::WriteCheckpointHeader& header, const std::string& path) {
  if (!hooks_.record_checkpoint) return absl::InternalError("the attempt records no checkpoints");
  return RunHook<absl::StatusOr<v1::Checkpoint>>(
      [&] { return hooks_.record_checkpoint(header, path); });
}

void WorkerAttempt::Command(v1::WorkerCommand::Action action) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::WorkerCommand c;
  c.set_action(action);
  commands_.push_back(std::move(c));
  cv_.notify_all();
}

void WorkerAttempt::FailLocked(absl::Status why) {
  if (failure_.ok()) failure_ = std::move(why);
  cv_.notify_all();
}

void WorkerAttempt::Fail(absl::Status why) {
  std::vector<KeyReady> aborted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(std::move(why));
    aborted = TakeWaitsLocked(nullptr);
  }
  Abort(std::move(aborted));
}

void WorkerAttempt::End() {
  std::vector<KeyReady> aborted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    aborted = TakeWaitsLocked(nullptr);
    keys_.clear();
    if (shared_budget_ != nullptr) shared_budget_->Give(key_bytes_);
    key_bytes_ = 0;
    cv_.notify_all();
  }
  Abort(std::move(aborted));
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return hooks_running_ == 0; });
}

bool WorkerAttempt::WaitForChange(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout)) == std::cv_status::no_timeout;
}

WorkerAttempt::Snapshot WorkerAttempt::State() {
  std::lock_guard<std::mutex> lock(mu_);
  return {ranks_, last_heard_, failure_, ended_};
}

WorkerRegistry::WorkerRegistry(std::string key, WorkerLimits limits)
    : key_(std::move(key)), limits_(limits), key_budget_(limits.max_key_bytes) {}

std::string WorkerRegistry::TokenFor(const std::string& job_id) const {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(job_id.data()), job_id.size(), mac, &mac_len);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), mac_len));
}

absl::StatusOr<std::shared_ptr<WorkerAttempt>> WorkerRegistry::Find(const std::string& job_id,
                                                                    const std::string& token) {
  const std::string expected = TokenFor(job_id);
  if (token.size() != expected.size() ||
      CRYPTO_memcmp(token.data(), expected.data(), expected.size()) != 0) {
    return absl::UnauthenticatedError(absl::StrCat("the worker token is not job ", job_id,
                                                   "'s (x-kiln-worker-token; `kiln worker-token ",
                                                   job_id, "` prints it)"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = attempts_.find(job_id);
  if (it == attempts_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is not running an attempt that takes workers now"));
  }
  return it->second;
}

void WorkerRegistry::Add(const std::shared_ptr<WorkerAttempt>& attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  attempts_[attempt->job_id()] = attempt;
}

void WorkerRegistry::Remove(const WorkerAttempt* attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = attempts_.find(attempt->job_id());
  if (it != attempts_.end() && it->second.get() == attempt) attempts_.erase(it);
}

void WorkerRegistry::SetCoordinatorAddress(std::string address) {
  std::lock_guard<std::mutex> lock(mu_);
  address_ = std::move(address);
  address_cv_.notify_all();
}

absl::StatusOr<std::string> WorkerRegistry::CoordinatorAddress(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  address_cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                       [&] { return !address_.empty(); });
  if (address_.empty()) {
    return absl::UnavailableError("kilnd's gRPC address is not known yet to hand to workers");
  }
  return address_;
}

absl::StatusOr<std::string> LoadOrCreateWorkerKey(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (in) {
    std::stringstream bytes;
    bytes << in.rdbuf();
    std::string key = bytes.str();
    if (key.size() >= 32) return key;
    return absl::DataLossError(absl::StrCat(path, " holds ", key.size(),
                                            " bytes, fewer than a worker key's 32; delete it to "
                                            "make a new one (workers then need new tokens)"));
  }
  std::string key(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), 32) != 1) {
    return absl::InternalError("no random bytes for the worker key");
  }
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> file = AtomicFileWriter::Open(path, 0600);
  if (!file.ok()) return file.status();
  if (absl::Status s = (*file)->Append(key); !s.ok()) return s;
  if (absl::Status s = (*file)->Commit(); !s.ok()) return s;
  return key;
}

}  // namespace kiln::server
