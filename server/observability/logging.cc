#include "server/observability/logging.h"

#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/trainer.h"
#include "server/jobs/job_vocabulary.h"

namespace kiln::server {
namespace {

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

std::string ModelOf(const v1::Job& job) {
  return job.spec().preset().empty() ? "custom" : job.spec().preset();
}

// logfmt: bare when safe, else double-quoted with \" \\ \n escapes.
std::string TextValue(const std::string& s) {
  bool bare = !s.empty();
  for (char c : s) {
    if (c == ' ' || c == '=' || c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) {
      bare = false;
    }
  }
  if (bare) return s;
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\x%02x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

struct TextVisitor {
  std::string operator()(const std::string& s) const { return TextValue(s); }
  std::string operator()(int64_t v) const { return absl::StrCat(v); }
  std::string operator()(double v) const { return absl::StrFormat("%.6g", v); }
  std::string operator()(bool v) const { return v ? "true" : "false"; }
};

struct JsonVisitor {
  nlohmann::json operator()(const std::string& s) const { return s; }
  nlohmann::json operator()(int64_t v) const { return v; }
  nlohmann::json operator()(double v) const {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(absl::StrFormat("%g", v));
  }
  nlohmann::json operator()(bool v) const { return v; }
};

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_format: expected text or json, got \"", std::string(name), "\""));
}

std::string EventLog::Format(LogLevel level, std::string_view event,
                             absl::Span<const LogField> fields) const {
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  if (format_ == LogFormat::kJson) {
    // ordered_json keeps the fields in the order given, which reads better.
    nlohmann::ordered_json line;
    line["ts"] = ts;
    line["level"] = LevelName(level);
    line["event"] = std::string(event);
    for (const LogField& f : fields) line[f.key] = std::visit(JsonVisitor{}, f.value);
    return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string line = absl::StrCat(ts, " ", LevelName(level), " ", std::string(event));
  for (const LogField& f : fields) {
    absl::StrAppend(&line, " ", f.key, "=", std::visit(TextVisitor{}, f.value));
  }
  return line;
}

void EventLog::Log(LogLevel level, std::string_view event, absl::Span<const LogField> fields) {
  if (out_ == nullptr) return;
  const std::string line = Format(level, event, fields) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

void EventLog::ServerStarted(const std::string& grpc_address, const std::string& metrics_address,
                             const std::string& default_device, const std::string& devices,
                             const std::string& no_cuda) {
  std::vector<LogField> fields = {
      {"grpc", grpc_address},
      {"metrics", metrics_address.empty() ? std::string("off") : metrics_address},
      {"device", default_device},
      {"devices", devices}};
  if (!no_cuda.empty()) fields.push_back({"no_cuda", no_cuda});
  fields.push_back({"pid", static_cast<int64_t>(getpid())});
  Log(LogLevel::kInfo, "server_started", fields);
}

void EventLog::JobSubmitted(const v1::Job& job) {
  Log(LogLevel::kInfo, "job_submitted",
      {{"job", job.id()},
       {"model", ModelOf(job)},
       {"dataset", job.spec().dataset()},
       {"device", job.device()},
       {"epochs", job.epochs()},
       {"parameters", job.parameter_count()}});
}

void EventLog::JobStarted(const v1::Job& job) {
  Log(LogLevel::kInfo, "job_started",
      {{"job", job.id()},
       {"device", job.device()},
       {"precision", JobPrecisionText(job.spec().precision(), job.device())},
       {"attempt", job.attempts()}});
}

void EventLog::JobQueued(const v1::Job& job) {
  Log(LogLevel::kInfo, "job_queued", {{"job", job.id()}, {"reason", job.reason()}});
}

void EventLog::JobStateChanged(const v1::Job& job, v1::JobState from) {
  switch (job.state()) {
    case v1::JOB_STATE_RUNNING:
      JobStarted(job);
      break;
    case v1::JOB_STATE_QUEUED:
      if (from != v1::JOB_STATE_UNSPECIFIED) JobQueued(job);
      break;
    case v1::JOB_STATE_SUCCEEDED:
    case v1::JOB_STATE_FAILED:
    case v1::JOB_STATE_CANCELLED:
      JobFinished(job);
      break;
    default:
      break;
  }
}

void EventLog::EpochDone(const std::string& job_id, const EpochEvent& e, int epochs) {
  std::vector<LogField> fields = {{"job", job_id},
                                  {"epoch", e.epoch},
                                  {"epochs", epochs},
                                  {"train_loss", e.train_loss},
                                  {"train_accuracy", e.train_accuracy}};
  if (e.test.samples > 0) {  // no test set: no test figures
    fields.insert(fields.end(), {{"test_loss", e.test.loss}, {"test_accuracy", e.test.accuracy}});
  }
  fields.insert(fields.end(),
                {{"seconds", e.train_seconds}, {"samples_per_second", e.samples_per_sec}});
  Log(LogLevel::kInfo, "epoch_done", fields);
}

void EventLog::CheckpointWritten(const v1::Checkpoint& c, double seconds) {
  Log(LogLevel::kInfo, "checkpoint_written",
      {{"job", c.job_id()},
       {"checkpoint", c.id()},
       {"kind", CheckpointKindName(c.kind())},
       {"step", c.global_step()},
       {"bytes", c.size_bytes()},
       {"seconds", seconds},
       {"path", c.path()}});
}

void EventLog::JobFinished(const v1::Job& job) {
  const bool failed = job.state() == v1::JOB_STATE_FAILED;
  Log(failed ? LogLevel::kError : LogLevel::kInfo, failed ? "job_failed" : "job_finished",
      {{"job", job.id()},
       {"state", JobStateName(job.state())},
       {"epochs_done", job.epochs_done()},
       {"step", job.global_step()},
       {"reason", job.reason()}});
}

void EventLog::ModelDeployed(const std::string& model, const std::string& version,
                             const std::string& job_id, int64_t checkpoint_id) {
  Log(LogLevel::kInfo, "model_deployed",
      {{"model", model}, {"version", version}, {"job", job_id}, {"checkpoint", checkpoint_id}});
}

void EventLog::ModelUndeployed(const std::string& model, const std::string& version) {
  Log(LogLevel::kInfo, "model_undeployed", {{"model", model}, {"version", version}});
}

}  // namespace kiln::server
