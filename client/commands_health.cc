// `kiln health` (what kilnd serves) and `kiln whoami` (who it takes the token for).
#include <cstdio>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli_status.h"
#include "client/command_env.h"
#include "client/table.h"
#include "common/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "inference/grpc_service.grpc.pb.h"
#include "kiln/v1/training.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace kiln::client {
namespace {

using grpc::health::v1::HealthCheckResponse;

// The health service's word on `service` ("" for the whole server), or why it could not say.
std::string CheckService(Connection& c, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(c.channel());
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  auto context = c.NewContext(absl::Seconds(5));
  grpc::Status status = stub->Check(context.get(), request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return "UNKNOWN SERVICE";
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) return "NO HEALTH SERVICE";
  if (!status.ok()) {
    return absl::StrCat(
        "ERROR (",
        status.error_message().empty()
            ? absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))
            : status.error_message(),
        ")");
  }
  return HealthCheckResponse::ServingStatus_Name(response.status());
}

absl::Status Health(CommandEnv& env) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  const std::string overall = CheckService(*c, "");
  const std::string training = CheckService(*c, "kiln.v1.Training");

  // Serving answers for itself through KServe's ServerReady and ServerMetadata.
  auto inference = inference::GRPCInferenceService::NewStub(c->channel());
  std::string serving, serving_detail;
  {
    inference::ServerMetadataResponse metadata;
    auto context = c->NewContext(absl::Seconds(5));
    grpc::Status status =
        inference->ServerMetadata(context.get(), inference::ServerMetadataRequest(), &metadata);
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      serving = "NOT SERVED";
      serving_detail = "this kilnd does not serve models (KServe v2 is not wired in)";
    } else if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      // Health is open to all; the rest of serving needs a token this call did not carry.
      serving = CheckService(*c, "inference.GRPCInferenceService");
      serving_detail = absl::StrCat("details need a token (", status.error_message(), ")");
    } else if (!status.ok()) {
      serving = "ERROR";
      serving_detail = status.error_message();
    } else {
      inference::ServerReadyResponse ready;
      auto ready_context = c->NewContext(absl::Seconds(5));
      grpc::Status r =
          inference->ServerReady(ready_context.get(), inference::ServerReadyRequest(), &ready);
      serving = r.ok() && ready.ready() ? "SERVING" : "NOT_SERVING";
      serving_detail = absl::StrCat(metadata.name(), " ", metadata.version());
      if (metadata.extensions_size() > 0) {
        absl::StrAppend(&serving_detail,
                        "; extensions: ", absl::StrJoin(metadata.extensions(), ", "));
      }
    }
  }

  if (env.json()) {
    nlohmann::json out = {
        {"server", c->server()},
        {"status", overall},
        {"services", {{"kiln.v1.Training", training}, {"inference.GRPCInferenceService", serving}}},
        {"serving_detail", serving_detail}};
    std::fprintf(env.out, "%s\n", out.dump(2).c_str());
  } else {
    std::fprintf(env.out, "kilnd at %s: %s\n", c->server().c_str(), overall.c_str());
    Table table({"SERVICE", "STATUS", "DETAIL"});
    table.AddRow({"kiln.v1.Training", training, ""});
    table.AddRow({"inference.GRPCInferenceService", serving, serving_detail});
    table.Print(env.out);
  }
  if (overall != "SERVING") {
    std::fprintf(env.err, "kiln: kilnd at %s is %s\n", c->server().c_str(), overall.c_str());
    return ReportedFailure();
  }
  return absl::OkStatus();
}

absl::Status WhoAmI(CommandEnv& env) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  v1::WhoAmIResponse response;
  auto context = c->NewContext();
  grpc::Status status = stub->WhoAmI(context.get(), v1::WhoAmIRequest(), &response);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    PrintJson(env, response);
    return absl::OkStatus();
  }
  if (!response.auth()) {
    std::fprintf(env.out, "kilnd at %s checks no tokens: every caller is an admin\n",
                 c->server().c_str());
    return absl::OkStatus();
  }
  KeyValueList kv;
  kv.Add("user", response.user());
  kv.Add("team", response.team().empty() ? "- (none)" : response.team());
  kv.Add("role", response.role());
  kv.Print(env.out);
  return absl::OkStatus();
}

}  // namespace

void AddWhoAmICommand(CLI::App& app, CommandEnv& env, Action* action) {
  CLI::App* w =
      app.add_subcommand("whoami", "Say who kilnd takes this token for: user, team, role");
  w->footer(
      "The token comes from --token / KILN_TOKEN; kilnd's token file names its user, team and "
      "role\n"
      "(viewer: read and predict; member: also change the team's jobs, datasets and deployments;\n"
      "admin: everything).\n\n"
      "Examples:\n"
      "  kiln whoami\n"
      "  kiln whoami --output json");
  w->callback([&env, action] { *action = [&env] { return WhoAmI(env); }; });
}

void AddHealthCommand(CLI::App& app, CommandEnv& env, Action* action) {
  CLI::App* h = app.add_subcommand("health", "Check that kilnd is up and what it serves");
  h->footer(
      "Exits 0 when kilnd is SERVING, 1 otherwise.\n\n"
      "Examples:\n"
      "  kiln health\n"
      "  kiln --server gpu-node-3:7070 health --output json");
  h->callback([&env, action] { *action = [&env] { return Health(env); }; });
}

}  // namespace kiln::client
