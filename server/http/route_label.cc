#include "server/http/route_label.h"

#include <regex>

#include "absl/strings/str_cat.h"

namespace kiln::http {

std::string RouteLabel(const std::string& path) {
  static const std::regex* const kModel = new std::regex(
      R"(/v2/models/[^/]+(?:/versions/[^/]+)?(/ready|/infer|/generate|/generate_stream)?)");
  static const std::regex* const kRepositoryModel =
      new std::regex(R"(/v2/repository/models/[^/]+/(load|unload))");
  for (const char* fixed :
       {"/metrics", "/v2/health/live", "/v2/health/ready", "/v2/repository/index"}) {
    if (path == fixed) return fixed;
  }
  if (path == "/v2" || path == "/v2/") return "/v2";
  std::smatch m;
  // The web page (server/web): its files, and its API with the job id and checkpoint folded.
  static const std::regex* const kApiJob = new std::regex(
      R"(/api/jobs/[^/]+(/checkpoints(/[0-9]+/file)?|/events|/cancel|/resume|/checkpoint)?)");
  for (const char* fixed : {"/", "/api/jobs", "/api/events", "/api/models"}) {
    if (path == fixed) return fixed;
  }
  if (path.rfind("/web/", 0) == 0) return "/web/{file}";
  if (std::regex_match(path, m, *kApiJob)) {
    return absl::StrCat("/api/jobs/{job}",
                        m[2].matched ? "/checkpoints/{checkpoint}/file" : m[1].str());
  }
  if (std::regex_match(path, m, *kModel)) return absl::StrCat("/v2/models/{model}", m[1].str());
  if (std::regex_match(path, m, *kRepositoryModel)) {
    return absl::StrCat("/v2/repository/models/{model}/", m[1].str());
  }
  return "other";
}

}  // namespace kiln::http
