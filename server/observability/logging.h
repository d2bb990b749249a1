// kilnd's structured event log: one line per event (job lifecycle, checkpoints, deployments,
// server start), as logfmt-style text or as JSON, written whole to one stream (stderr).
#pragma once

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kiln/v1/training.pb.h"

namespace kiln {
struct EpochEvent;
}

namespace kiln::server {

enum class LogFormat { kText, kJson };

// "text" or "json"; InvalidArgument otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name);

enum class LogLevel { kInfo, kWarning, kError };

// One key=value pair of an event line.
struct LogField {
  using Value = std::variant<std::string, int64_t, double, bool>;

  LogField(std::string_view k, std::string_view v) : key(k), value(std::string(v)) {}
  LogField(std::string_view k, const char* v) : key(k), value(std::string(v)) {}
  LogField(std::string_view k, const std::string& v) : key(k), value(v) {}
  LogField(std::string_view k, bool v) : key(k), value(v) {}
  LogField(std::string_view k, double v) : key(k), value(v) {}
  template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
  LogField(std::string_view k, I v) : key(k), value(static_cast<int64_t>(v)) {}

  std::string key;
  Value value;
};

// Thread-safe; each event is written with one fwrite and flushed.
class EventLog {
 public:
  // `out` null: events are formatted (for tests via Format) but written nowhere.
  explicit EventLog(LogFormat format, std::FILE* out = stderr) : format_(format), out_(out) {}

  // The line for an event, without the trailing newline. Text:
  //   2026-12-02T14:52:50.123Z info job_started job=job-1 device=cpu
  // JSON: {"ts":"...","level":"info","event":"job_started","job":"job-1","device":"cpu"}
  std::string Format(LogLevel level, std::string_view event,
                     absl::Span<const LogField> fields) const;
  void Log(LogLevel level, std::string_view event, absl::Span<const LogField> fields);

  // The events kilnd emits; each carries the job id where there is one.
  // metrics_address empty: not served. devices: those found, comma-separated; no_cuda: why no
  // CUDA device was found (the field is left out when one was).
  void ServerStarted(const std::string& grpc_address, const std::string& metrics_address,
                     const std::string& default_device, const std::string& devices,
                     const std::string& no_cuda);
  void JobSubmitted(const v1::Job& job);
  void JobStarted(const v1::Job& job);
  void JobQueued(const v1::Job& job);  // again, after a resume or a restart
  // Dispatches a state change of `job` (already in its new state) to JobStarted, JobQueued or
  // JobFinished; the first QUEUED (from UNSPECIFIED) is JobSubmitted's, so logs nothing.
  void JobStateChanged(const v1::Job& job, v1::JobState from);
  void EpochDone(const std::string& job_id, const EpochEvent& epoch, int epochs);
  void CheckpointWritten(const v1::Checkpoint& checkpoint, double seconds);
  // SUCCEEDED and CANCELLED at info level, FAILED at error level with the reason.
  void JobFinished(const v1::Job& job);
  // For the serving front end: a checkpoint of `job_id` is now served as `model`/`version`.
  void ModelDeployed(const std::string& model, const std::string& version,
                     const std::string& job_id, int64_t checkpoint_id);
  void ModelUndeployed(const std::string& model, const std::string& version);

 private:
  const LogFormat format_;
  std::FILE* const out_;
  std::mutex mu_;
};

}  // namespace kiln::server
