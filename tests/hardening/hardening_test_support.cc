#include "hardening_test_support.h"

#include <grpcpp/grpcpp.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/data/dataset.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/jobs/spec_translation.h"

namespace kiln::server::hardening {

std::string SqliteIntegrityCheck(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    std::string error = absl::StrCat("open ", path, ": ", db ? sqlite3_errmsg(db) : "no memory");
    sqlite3_close(db);
    return error;
  }
  std::vector<std::string> rows;
  char* error = nullptr;
  const int rc = sqlite3_exec(
      db, "PRAGMA integrity_check",
      [](void* out, int columns, char** values, char**) {
        if (columns > 0 && values[0] != nullptr) {
          static_cast<std::vector<std::string>*>(out)->push_back(values[0]);
        }
        return 0;
      },
      &rows, &error);
  if (rc != SQLITE_OK) rows.push_back(absl::StrCat("integrity_check failed: ", error ? error : ""));
  sqlite3_free(error);
  sqlite3_close(db);
  return absl::StrJoin(rows, "; ");
}

absl::StatusOr<TrainingPosition> LoadCheckpointForSpec(const v1::JobSpec& spec,
                                                       const std::string& dataset_dir,
                                                       const std::string& path) {
  KILN_ASSIGN_OR_RETURN(TrainConfig config, TranslateSpec(spec, SpecLimits{}));
  KILN_ASSIGN_OR_RETURN(DatasetSplits data, LoadImageFolder(dataset_dir));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("cpu", {/*threads=*/1}));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                        Trainer::Create(config, backend.get(), &data.train,
                                        data.test.size > 0 ? &data.test : nullptr));
  KILN_RETURN_IF_ERROR(trainer->LoadCheckpoint(path));
  return trainer->position();
}

int64_t ResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    // "VmRSS:	   12345 kB"
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::string digits;
    for (char c : line) {
      if (c >= '0' && c <= '9') digits.push_back(c);
    }
    int64_t kib = 0;
    return absl::SimpleAtoi(digits, &kib) ? kib * 1024 : -1;
  }
  return -1;
}

double CpuSeconds(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // "PID (COMM) STATE ..." where COMM may hold spaces: fields count from the last ')'; utime and
  // stime are fields 14 and 15, in clock ticks.
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(text.substr(paren + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i < 14) continue;
    double v = 0;
    if (!absl::SimpleAtod(field, &v)) return -1;
    ticks += v;
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int OpenDescriptors(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return ec ? -1 : n;
}

bool HealthServing(int port, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  return stub->Check(&context, request, &response).ok() &&
         response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace kiln::server::hardening
