// kilnd: the kiln training daemon. Parses flags, starts the Daemon, stops it gracefully on
// SIGTERM or SIGINT, and reads its bearer tokens and TLS files again on SIGHUP.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "server/daemon.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "HOST:PORT to serve gRPC on (port 0: any)");
ABSL_FLAG(std::string, state_dir, "", "folder for the job database and checkpoints (required)");
ABSL_FLAG(std::string, data_dir, "", "folder of named datasets, one subfolder each (required)");
ABSL_FLAG(std::string, device, "auto", "default device for jobs: auto, cpu or cuda:N");
ABSL_FLAG(int, max_jobs_per_device, 1, "jobs running at once on each device");
ABSL_FLAG(int, max_queued_jobs, 1000, "jobs waiting at once; more are refused");
ABSL_FLAG(int, team_max_running_jobs, 0,
          "jobs one team (the token file's team=) runs at once; more wait (0: no limit)");
ABSL_FLAG(int, team_max_gpus, 0, "GPUs one team's running jobs hold at once (0: no limit)");
ABSL_FLAG(int64_t, team_max_storage_bytes, 0,
          "bytes of datasets and checkpoints one team keeps; past it its uploads, submissions and "
          "resumes are refused (0: no limit)");
ABSL_FLAG(int64_t, max_upload_bytes, int64_t{512} << 20,
          "size limit of one dataset upload, counted after decompression");
ABSL_FLAG(int64_t, max_parameters, 50'000'000, "largest model accepted, in parameters");
ABSL_FLAG(int, max_layers, 64, "most layers a submitted model may have");
ABSL_FLAG(int64_t, max_activation_bytes, int64_t{8} << 30,
          "largest activation memory of one training batch (activations and gradients, bytes)");
ABSL_FLAG(int64_t, max_job_memory_bytes, 0,
          "most memory one job may need, host and device together, as the engine's memory plan "
          "counts it before the job starts (0: three quarters of this machine's memory)");
ABSL_FLAG(int64_t, max_serving_memory_bytes, 0,
          "most memory all deployed model versions together may need, each counted by the "
          "engine's memory plan at its max_batch_size; a deployment past it is refused, also when "
          "restoring deployments at start (0: half of this machine's memory)");
ABSL_FLAG(int, max_crash_resumes, 3,
          "times a job running when kilnd died is resumed on restart before it fails instead");
ABSL_FLAG(int, max_epochs, 10'000, "most epochs a job may ask for");
ABSL_FLAG(int, max_batch_size, 65'536, "largest training batch a job may ask for");
ABSL_FLAG(int, max_message_bytes, 16 << 20, "largest gRPC message kilnd accepts, in bytes");
ABSL_FLAG(int, max_streams, 256,
          "streaming calls (WatchJob, ExportCheckpoint, UploadDataset) open at once");
ABSL_FLAG(int, max_web_streams, 4,
          "the web API's live event streams and checkpoint downloads open at once, each holding "
          "one of the 16 HTTP threads (more are answered 503)");
ABSL_FLAG(absl::Duration, web_stream_max_duration, absl::Minutes(5),
          "the longest a web event stream stays open; then it ends and the page opens it again");
ABSL_FLAG(int, max_generations, 4,
          "text generations (REST generate and generate_stream, gRPC GenerationService) running "
          "at once over all models; more are refused (429, RESOURCE_EXHAUSTED). Each ends after "
          "--web_stream_max_duration");
ABSL_FLAG(int, max_health_watches, 256,
          "grpc.health.v1 Watch streams open at once (they need no token, so they have their own "
          "limit)");
ABSL_FLAG(int, max_connections, 1000,
          "gRPC connections open at once; more are closed on accept (clients retry)");
ABSL_FLAG(int, reserved_descriptors, 64,
          "descriptors below the open-file limit kept for job and store files, never for "
          "connections");
ABSL_FLAG(absl::Duration, connection_handshake_timeout, absl::Seconds(10),
          "a connection that has not completed its TLS and HTTP/2 handshake by then is closed");
ABSL_FLAG(absl::Duration, connection_idle_timeout, absl::Minutes(5),
          "a connection with no call for this long is closed (clients reconnect on their next)");
ABSL_FLAG(int, http_max_connections, 512,
          "HTTP connections open at once; at the cap the one waiting longest without a request "
          "under way is closed to make room, else the new one");
ABSL_FLAG(int64_t, http_max_header_bytes, 64 << 10,
          "largest HTTP request line and header fields, in bytes (431 past it)");
ABSL_FLAG(int, http_max_headers, 100, "most header fields of an HTTP request (431 past them)");
ABSL_FLAG(absl::Duration, http_header_timeout, absl::Seconds(10),
          "an HTTP request's line and headers (and a TLS handshake) must arrive within this of "
          "the first byte, or the connection is closed");
ABSL_FLAG(absl::Duration, http_request_timeout, absl::Seconds(60),
          "an HTTP request's head and body must arrive within this of the first byte (408)");
ABSL_FLAG(int64_t, max_inference_batch, 16384, "most samples one ModelInfer request may carry");
ABSL_FLAG(int, max_deploy_batch_size, 1024,
          "largest dynamic-batching max_batch_size a deployment may ask for");
ABSL_FLAG(int64_t, max_step_events_per_job, 10'000,
          "step events kept per job (at least 100): the newest half whole, older ones thinned "
          "to a power-of-two stride of the step number; states and checkpoints are always kept");
ABSL_FLAG(int64_t, max_epoch_events_per_job, 20'000,
          "epoch events kept per job (a job retried or resumed repeats its epochs); past it the "
          "oldest go");
ABSL_FLAG(absl::Duration, shutdown_timeout, absl::Seconds(30),
          "how long running jobs get to checkpoint and stop on SIGTERM/SIGINT");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "HOST:PORT of the HTTP port: Prometheus /metrics and KServe v2 REST under /v2, with "
          "the gRPC port's TLS and tokens (port 0: any; empty: off)");
ABSL_FLAG(std::vector<std::string>, http_allowed_hosts, {},
          "comma-separated Host names the HTTP port answers besides IP addresses and localhost "
          "when it asks no token (others are refused: DNS rebinding); e.g. kilnd.example.com");
ABSL_FLAG(bool, metrics_require_token, false,
          "with --auth_tokens_file, /metrics needs a bearer token too (/v2 always does)");
ABSL_FLAG(int, metrics_max_ended_jobs, 500,
          "ended jobs whose per-job series are kept at most; past it the first ended go first, "
          "before --metrics_job_retention");
ABSL_FLAG(absl::Duration, metrics_job_retention, absl::Minutes(10),
          "how long a finished job's labelled series stay in /metrics");
ABSL_FLAG(std::string, log_format, "text", "event log lines on stderr: text or json");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain to serve TLS with (needs --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert, unencrypted");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA that client certificates must chain to: mutual TLS, clients without one are "
          "refused");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(60),
          "how often the --tls_* files are read again, so that renewed certificates are served "
          "without a restart (0: only on SIGHUP); a renewal that does not check out is logged "
          "and the files in force stay");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "file of accepted bearer tokens, one per line ('#' comments); every call but health "
          "then needs 'authorization: Bearer TOKEN'. SIGHUP reloads it");
ABSL_FLAG(std::string, worker_binary, "",
          "kiln-worker executable started for jobs of several workers (default: beside kilnd)");
ABSL_FLAG(absl::Duration, worker_join_timeout, absl::Seconds(60),
          "how long the workers kilnd starts may take to join their job");
ABSL_FLAG(absl::Duration, external_worker_join_timeout, absl::Minutes(10),
          "how long workers started elsewhere (JobSpec.external_workers) may take to join");
ABSL_FLAG(absl::Duration, worker_heartbeat_timeout, absl::Minutes(1),
          "a worker that joined and sends no report and no keep-alive for this long fails its "
          "job's attempt (workers send a keep-alive every quarter of it)");
ABSL_FLAG(int, max_rendezvous_waiters_per_job, 256,
          "rendezvous waits (Workers.GetKey) one job's workers may have open at once; more are "
          "refused");
ABSL_FLAG(int64_t, max_rendezvous_bytes_per_job, int64_t{16} << 20,
          "bytes of rendezvous keys and values (Workers.SetKey) one job's attempt may hold");
ABSL_FLAG(int64_t, max_rendezvous_bytes, int64_t{256} << 20,
          "bytes of rendezvous keys and values all jobs together may hold");
ABSL_FLAG(std::string, worker_tls_ca, "",
          "with --tls_cert: the CA the workers kilnd starts verify it with (else such jobs are "
          "refused)");
ABSL_FLAG(std::string, worker_tls_server_name, "",
          "with --worker_tls_ca: the name workers verify when the certificate does not name "
          "the listen address");
ABSL_FLAG(std::string, worker_tls_cert, "",
          "with --tls_client_ca: the client certificate the workers kilnd starts present");
ABSL_FLAG(std::string, worker_tls_key, "", "the key of --worker_tls_cert");
ABSL_FLAG(absl::Duration, step_delay, absl::ZeroDuration(),
          "testing only: pause after every training step");

namespace {

// kilnd's own lines, outside the daemon's event log: "kilnd: ..." text, or with --log_format
// json an event line like every other, so that a log collector reading stdout and stderr sees
// nothing but JSON.
class MainLines {
 public:
  explicit MainLines(kiln::server::LogFormat format) : format_(format) {}
  void Say(std::FILE* out, kiln::server::LogLevel level, std::string_view event,
           std::initializer_list<kiln::server::LogField> fields, const std::string& text) const {
    if (format_ == kiln::server::LogFormat::kJson) {
      kiln::server::EventLog(format_, out).Log(level, event, fields);
    } else {
      std::fprintf(out, "kilnd: %s\n", text.c_str());
      std::fflush(out);
    }
  }

 private:
  const kiln::server::LogFormat format_;
};

// The signals main acts on (TERM and INT stop, HUP reloads), blocked in every thread (threads
// inherit the mask) so that main takes them with sigwait; and those the daemon ignores.
sigset_t BlockSignals() {
  sigset_t handled_signals;
  sigemptyset(&handled_signals);
  sigaddset(&handled_signals, SIGTERM);
  sigaddset(&handled_signals, SIGINT);
  sigaddset(&handled_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &handled_signals, nullptr);
  // A vanished client must not kill the daemon through a broken pipe.
  signal(SIGPIPE, SIG_IGN);
  // Past a file-size limit (RLIMIT_FSIZE) a write must fail with EFBIG, failing that checkpoint,
  // not kill the daemon.
  signal(SIGXFSZ, SIG_IGN);
  return handled_signals;
}

// numerator/denominator of this machine's physical memory, or `fallback` when it is not known.
int64_t ShareOfMemory(int64_t numerator, int64_t denominator, int64_t fallback) {
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? pages / denominator * numerator * page : fallback;
}

// The daemon's options from the flags; InvalidArgument for an unknown --log_format.
absl::StatusOr<kiln::server::DaemonOptions> OptionsFromFlags() {
  kiln::server::DaemonOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.device = absl::GetFlag(FLAGS_device);
  options.max_jobs_per_device = absl::GetFlag(FLAGS_max_jobs_per_device);
  options.max_crash_resumes = absl::GetFlag(FLAGS_max_crash_resumes);
  options.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_jobs);
  options.team_quota.max_running_jobs = absl::GetFlag(FLAGS_team_max_running_jobs);
  options.team_quota.max_gpus = absl::GetFlag(FLAGS_team_max_gpus);
  options.team_max_storage_bytes = absl::GetFlag(FLAGS_team_max_storage_bytes);
  options.max_upload_bytes = absl::GetFlag(FLAGS_max_upload_bytes);
  options.limits.max_parameters = absl::GetFlag(FLAGS_max_parameters);
  options.limits.max_layers = absl::GetFlag(FLAGS_max_layers);
  options.limits.max_activation_bytes = absl::GetFlag(FLAGS_max_activation_bytes);
  options.limits.max_job_memory_bytes = absl::GetFlag(FLAGS_max_job_memory_bytes);
  if (options.limits.max_job_memory_bytes == 0) {
    options.limits.max_job_memory_bytes = ShareOfMemory(3, 4, int64_t{16} << 30);
  }
  // Served versions stay in memory for as long as they are deployed, beside the jobs that
  // train: half of the machine by default, so that they alone (or restoring them at start) can
  // never fill it, and a job admitted by --max_job_memory_bytes still finds room.
  options.max_serving_memory_bytes = absl::GetFlag(FLAGS_max_serving_memory_bytes);
  if (options.max_serving_memory_bytes == 0) {
    options.max_serving_memory_bytes = ShareOfMemory(1, 2, int64_t{8} << 30);
  }
  options.limits.max_epochs = absl::GetFlag(FLAGS_max_epochs);
  options.limits.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_streams = absl::GetFlag(FLAGS_max_streams);
  options.max_web_long_answers = absl::GetFlag(FLAGS_max_web_streams);
  options.web_stream_max_duration = absl::GetFlag(FLAGS_web_stream_max_duration);
  options.max_generations = absl::GetFlag(FLAGS_max_generations);
  for (const std::string& host : absl::GetFlag(FLAGS_http_allowed_hosts)) {
    options.http_allowed_hosts.push_back(absl::AsciiStrToLower(host));
  }
  options.max_health_watches = absl::GetFlag(FLAGS_max_health_watches);
  options.max_connections = absl::GetFlag(FLAGS_max_connections);
  options.reserved_descriptors = absl::GetFlag(FLAGS_reserved_descriptors);
  options.connection_handshake_timeout = absl::GetFlag(FLAGS_connection_handshake_timeout);
  options.connection_idle_timeout = absl::GetFlag(FLAGS_connection_idle_timeout);
  options.http_limits.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  const int64_t http_head = absl::GetFlag(FLAGS_http_max_header_bytes);
  options.http_limits.max_header_bytes = http_head < 0 ? 0 : static_cast<size_t>(http_head);
  options.http_limits.max_headers = absl::GetFlag(FLAGS_http_max_headers);
  options.http_limits.header_timeout = absl::GetFlag(FLAGS_http_header_timeout);
  options.http_limits.request_timeout = absl::GetFlag(FLAGS_http_request_timeout);
  options.max_inference_batch = absl::GetFlag(FLAGS_max_inference_batch);
  options.max_deploy_batch_size = absl::GetFlag(FLAGS_max_deploy_batch_size);
  options.max_step_events_per_job = absl::GetFlag(FLAGS_max_step_events_per_job);
  options.max_epoch_events_per_job = absl::GetFlag(FLAGS_max_epoch_events_per_job);
  options.step_delay = absl::GetFlag(FLAGS_step_delay);
  options.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  options.worker_join_timeout = absl::GetFlag(FLAGS_worker_join_timeout);
  options.external_worker_join_timeout = absl::GetFlag(FLAGS_external_worker_join_timeout);
  options.worker_heartbeat_timeout = absl::GetFlag(FLAGS_worker_heartbeat_timeout);
  options.worker_limits.max_key_waiters_per_job =
      absl::GetFlag(FLAGS_max_rendezvous_waiters_per_job);
  options.worker_limits.max_key_bytes_per_job = absl::GetFlag(FLAGS_max_rendezvous_bytes_per_job);
  options.worker_limits.max_key_bytes = absl::GetFlag(FLAGS_max_rendezvous_bytes);
  options.worker_tls_ca = absl::GetFlag(FLAGS_worker_tls_ca);
  options.worker_tls_server_name = absl::GetFlag(FLAGS_worker_tls_server_name);
  options.worker_tls_cert = absl::GetFlag(FLAGS_worker_tls_cert);
  options.worker_tls_key = absl::GetFlag(FLAGS_worker_tls_key);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  // The default address may be taken by another kilnd (a warning, then no metrics); one asked
  // for explicitly must work.
  const absl::CommandLineFlag* metrics_flag = absl::FindCommandLineFlag("metrics_listen");
  options.metrics_require_token = absl::GetFlag(FLAGS_metrics_require_token);
  options.metrics_optional = metrics_flag->CurrentValue() == metrics_flag->DefaultValue();
  options.metrics_job_retention = absl::GetFlag(FLAGS_metrics_job_retention);
  options.metrics_max_ended_jobs = absl::GetFlag(FLAGS_metrics_max_ended_jobs);
  options.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key = absl::GetFlag(FLAGS_tls_key);
  options.tls.client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.tls_reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  auto log_format = kiln::server::ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!log_format.ok()) return log_format.status();
  options.log_format = *log_format;
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  // Memory a job frees goes back to the system. glibc raises its mmap threshold to the largest
  // block freed so far (up to 32 MiB); from then on a job's tensors and dataset come from
  // per-thread arenas of 64 MiB that keep their pages when freed, so every arena ends up
  // resident: 200 short jobs left kilnd at 449 MB RSS (1,137 jobs: 922 MB) while its heap never
  // held more than 24 MB (heaptrack). A fixed threshold keeps blocks of 128 KiB and more in
  // mappings of their own, unmapped on free: 44 MB after the same 200 jobs.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  // Our flags live in this file, which absl's --help would not list by default.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "kilnd --listen HOST:PORT --state_dir DIR --data_dir DIR [--device auto|cpu|cuda:N] "
      "[--max_jobs_per_device N] [--tls_cert F --tls_key F [--tls_client_ca F]] "
      "[--auth_tokens_file F]");
  absl::ParseCommandLine(argc, argv);

  const sigset_t handled_signals = BlockSignals();
  absl::StatusOr<kiln::server::DaemonOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", std::string(options.status().message()).c_str());
    return 1;
  }
  using kiln::server::LogLevel;
  const MainLines lines(options->log_format);

  auto daemon = kiln::server::Daemon::Start(*options);
  if (!daemon.ok()) {
    const std::string reason(daemon.status().message());
    lines.Say(stderr, LogLevel::kError, "start_failed", {{"reason", reason}}, reason);
    return 1;
  }
  // Tests and scripts read this line to learn the port ("kilnd: listening on port N", or the
  // "listening" event's "port" with --log_format json).
  const int port = (*daemon)->port(), metrics_port = (*daemon)->metrics_port();
  lines.Say(stdout, LogLevel::kInfo, "listening", {{"port", port}},
            "listening on port " + std::to_string(port));
  if (metrics_port != 0) {
    lines.Say(stdout, LogLevel::kInfo, "metrics_listening", {{"port", metrics_port}},
              "metrics on port " + std::to_string(metrics_port));
  }

  int signal_number = 0;
  // A reload logs its outcome (a bad file keeps the old tokens) and the daemon serves on.
  while (sigwait(&handled_signals, &signal_number) == 0 && signal_number == SIGHUP) {
    (*daemon)->Reload();
  }
  lines.Say(stderr, LogLevel::kInfo, "signal", {{"signal", signal_number}},
            "signal " + std::to_string(signal_number) + ", shutting down");
  absl::Status stopped = (*daemon)->Shutdown(absl::GetFlag(FLAGS_shutdown_timeout));
  if (!stopped.ok()) {
    // Jobs still training are RUNNING in the store and resume from their last checkpoint.
    const std::string reason(stopped.message());
    lines.Say(stderr, LogLevel::kError, "stop_timed_out", {{"reason", reason}},
              reason + "; exiting anyway");
    std::_Exit(2);
  }
  lines.Say(stderr, LogLevel::kInfo, "stopped", {}, "stopped");
  return 0;
}
