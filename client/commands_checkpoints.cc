// kiln checkpoints, checkpoint, export and delete-checkpoint: listing, taking, downloading (as
// safetensors, or converted to ONNX here) and deleting a job's checkpoints.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli_status.h"
#include "client/command_env.h"
#include "client/format.h"
#include "client/job_ref.h"
#include "client/onnx/onnx_export.h"
#include "client/plain_enum_names.h"
#include "client/table.h"
#include "common/atomic_file.h"
#include "common/byte_size.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "kiln/v1/training.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace kiln::client {
namespace {

absl::StatusOr<v1::ListCheckpointsResponse> FetchCheckpoints(Connection& c,
                                                             const std::string& job_id) {
  auto stub = v1::Training::NewStub(c.channel());
  v1::ListCheckpointsRequest request;
  request.set_job_id(job_id);
  v1::ListCheckpointsResponse response;
  auto context = c.NewContext();
  grpc::Status status = stub->ListCheckpoints(context.get(), request, &response);
  if (!status.ok()) return ServerError(status);
  return response;
}

absl::Status ListCheckpoints(CommandEnv& env, const std::string& job_id,
                             const std::vector<std::string>& kind_names) {
  // --kind takes the words the KIND column shows ("best", "on_demand"), as every enum flag does.
  std::set<int> kinds;
  for (const std::string& name : kind_names) {
    KILN_ASSIGN_OR_RETURN(const google::protobuf::EnumValueDescriptor* kind,
                          ParsePlainEnumName(v1::CheckpointKind_descriptor(), name, "--kind"));
    kinds.insert(kind->number());
  }
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  KILN_ASSIGN_OR_RETURN(v1::ListCheckpointsResponse all, FetchCheckpoints(*c, job_id));
  v1::ListCheckpointsResponse response;
  for (v1::Checkpoint& ck : *all.mutable_checkpoints()) {
    if (kinds.empty() || kinds.count(ck.kind()) > 0) *response.add_checkpoints() = std::move(ck);
  }
  if (env.json()) {
    PrintJson(env, response);
    return absl::OkStatus();
  }
  if (response.checkpoints().empty() && !kinds.empty()) {
    std::fprintf(env.out, "%s has no checkpoints of those kinds\n", job_id.c_str());
    return absl::OkStatus();
  }
  if (response.checkpoints().empty()) {
    std::fprintf(env.out, "%s has no checkpoints yet; take one with: kiln checkpoint %s\n",
                 job_id.c_str(), job_id.c_str());
    return absl::OkStatus();
  }
  Table table({"ID", "KIND", "EPOCHS", "STEP", "TEST ACC", "SIZE", "CREATED", "PATH"});
  for (const v1::Checkpoint& ck : response.checkpoints()) {
    table.AddRow({absl::StrCat(ck.id()), CheckpointKindName(ck.kind()),
                  absl::StrCat(ck.epochs_done()), absl::StrCat(ck.global_step()),
                  ck.epochs_done() > 0 ? FormatPercent(ck.test_accuracy()) : "-",
                  FormatBytes(ck.size_bytes()), FormatTime(ck.create_time()), ck.path()});
  }
  table.Print(env.out);
  return absl::OkStatus();
}

absl::Status TakeCheckpoint(CommandEnv& env, const std::string& job_id) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  v1::CreateCheckpointRequest request;
  request.set_job_id(job_id);
  v1::Checkpoint ck;
  auto context = c->NewContext(absl::Minutes(5));
  grpc::Status status = stub->CreateCheckpoint(context.get(), request, &ck);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    PrintJson(env, ck);
  } else {
    std::fprintf(env.out, "checkpoint %lld of %s written: epoch %d, step %lld, %s, %s\n",
                 static_cast<long long>(ck.id()), job_id.c_str(), ck.epochs_done(),
                 static_cast<long long>(ck.global_step()), FormatBytes(ck.size_bytes()).c_str(),
                 ck.path().c_str());
  }
  return absl::OkStatus();
}

// The checkpoint id `ref` names (0: the latest, which the server picks).
absl::StatusOr<int64_t> ResolveCheckpoint(Connection& c, const CheckpointRef& ref) {
  if (ref.which == CheckpointRef::Which::kId) return ref.checkpoint_id;
  if (ref.which == CheckpointRef::Which::kLatest) return 0;
  KILN_ASSIGN_OR_RETURN(v1::ListCheckpointsResponse list, FetchCheckpoints(c, ref.job_id));
  const v1::Checkpoint* best = nullptr;
  for (const v1::Checkpoint& ck : list.checkpoints()) {
    // Later ones win ties: they have trained longer for the same accuracy.
    if (best == nullptr || ck.test_accuracy() >= best->test_accuracy()) best = &ck;
  }
  if (best == nullptr) {
    return absl::NotFoundError(absl::StrCat(ref.job_id, " has no checkpoints"));
  }
  return best->id();
}

absl::Status DeleteCheckpoint(CommandEnv& env, const std::string& text) {
  KILN_ASSIGN_OR_RETURN(CheckpointRef ref, ParseCheckpointRef(text));
  if (ref.which != CheckpointRef::Which::kId) {
    return UsageError(
        absl::StrCat("name the checkpoint to delete by its id, JOB@ID (see: kiln "
                     "checkpoints ",
                     ref.job_id, "), not \"", text, "\""));
  }
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  v1::DeleteCheckpointRequest request;
  request.set_job_id(ref.job_id);
  request.set_checkpoint_id(ref.checkpoint_id);
  v1::Checkpoint ck;
  auto context = c->NewContext();
  grpc::Status status = stub->DeleteCheckpoint(context.get(), request, &ck);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    PrintJson(env, ck);
  } else {
    std::fprintf(env.out, "deleted checkpoint %lld of %s (epoch %d, step %lld, %s)\n",
                 static_cast<long long>(ck.id()), ref.job_id.c_str(), ck.epochs_done(),
                 static_cast<long long>(ck.global_step()), FormatBytes(ck.size_bytes()).c_str());
  }
  return absl::OkStatus();
}

struct ExportOptions {
  std::string ref;
  std::string output;
  std::string format = "safetensors";  // or "onnx"
  bool force = false;
};

absl::Status Export(CommandEnv& env, const ExportOptions& o) {
  KILN_ASSIGN_OR_RETURN(CheckpointRef ref, ParseCheckpointRef(o.ref));
  if (!o.output.empty() && !o.force && std::filesystem::exists(o.output)) {
    return UsageError(absl::StrCat(o.output, " exists; pass --force to overwrite it"));
  }
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  KILN_ASSIGN_OR_RETURN(int64_t checkpoint_id, ResolveCheckpoint(*c, ref));
  auto stub = v1::Training::NewStub(c->channel());
  v1::ExportCheckpointRequest request;
  request.set_job_id(ref.job_id);
  request.set_checkpoint_id(checkpoint_id);
  auto context = c->NewContext(absl::Minutes(30));
  auto reader = stub->ExportCheckpoint(context.get(), request);
  const bool onnx = o.format == "onnx";
  const char* extension = onnx ? "onnx" : "safetensors";

  v1::CheckpointChunk chunk;
  v1::Checkpoint ck;
  std::string path, server_sha;
  std::unique_ptr<AtomicFileWriter> file;  // dropped uncommitted, it leaves nothing behind
  Sha256 sha;
  int64_t bytes = 0;
  absl::Status local;
  while (reader->Read(&chunk)) {
    if (chunk.has_checkpoint() && path.empty()) {
      ck = chunk.checkpoint();
      path = o.output.empty() ? absl::StrCat(ref.job_id, "-", ck.id(), ".", extension) : o.output;
      // ONNX: the checkpoint goes to a temp file beside PATH that is never published; the
      // writer removes it when dropped, after the conversion read it.
      absl::StatusOr<std::unique_ptr<AtomicFileWriter>> opened =
          AtomicFileWriter::Open(onnx ? path + ".safetensors" : path);
      if (!opened.ok()) {
        local = opened.status();
        context->TryCancel();
        break;
      }
      file = std::move(*opened);
    }
    if (path.empty()) {
      local = absl::DataLossError("the server sent data before naming the checkpoint");
      context->TryCancel();
      break;
    }
    if (chunk.offset() != bytes) {
      local = absl::DataLossError(
          absl::StrCat("chunk at offset ", chunk.offset(), " but ", bytes, " bytes received"));
      context->TryCancel();
      break;
    }
    local = file->Append(chunk.data());
    if (!local.ok()) {
      context->TryCancel();
      break;
    }
    sha.Update(chunk.data());
    bytes += static_cast<int64_t>(chunk.data().size());
    if (!chunk.sha256().empty()) server_sha = chunk.sha256();
  }
  grpc::Status status = reader->Finish();
  if (!local.ok()) return local;
  if (!status.ok()) return ServerError(status);
  if (server_sha.empty()) {
    return absl::DataLossError("the server sent no sha256 with the last chunk");
  }
  const std::string got = sha.HexDigest();
  if (absl::AsciiStrToLower(server_sha) != got) {
    return absl::DataLossError(absl::StrCat("sha256 mismatch: the server says ", server_sha,
                                            ", the received file has ", got,
                                            "; nothing was written"));
  }
  if (file == nullptr) return absl::DataLossError("the server sent no checkpoint");
  if (onnx) {
    // Converted from the verified bytes; the ONNX file's own size is what the user gets.
    KILN_RETURN_IF_ERROR(ExportOnnx(file->temp_path(), path));
    std::error_code error;
    bytes = static_cast<int64_t>(std::filesystem::file_size(path, error));
  } else {
    KILN_RETURN_IF_ERROR(file->Commit());
  }
  if (env.json()) {
    nlohmann::json out = {{"file", path}, {"format", o.format}, {"bytes", bytes}, {"sha256", got}};
    out["checkpoint"] = nlohmann::json::parse(MessageToJson(ck));
    std::fprintf(env.out, "%s\n", out.dump(2).c_str());
  } else {
    std::fprintf(env.out,
                 "exported checkpoint %lld of %s (epoch %d, step %lld) to %s: %s%s, sha256 %s\n",
                 static_cast<long long>(ck.id()), ref.job_id.c_str(), ck.epochs_done(),
                 static_cast<long long>(ck.global_step()), path.c_str(), FormatBytes(bytes).c_str(),
                 onnx ? absl::StrCat(" ONNX (opset ", kOnnxOpset, ")").c_str() : "", got.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

void AddCheckpointCommands(CLI::App& app, CommandEnv& env, Action* action) {
  auto list_id = std::make_shared<std::string>();
  auto list_kinds = std::make_shared<std::vector<std::string>>();
  CLI::App* l = app.add_subcommand("checkpoints", "List a job's checkpoints, oldest first");
  l->add_option("job", *list_id, "Job id")->required();
  l->add_option("--kind", *list_kinds,
                "Only these kinds: periodic, best, on_demand, shutdown, final")
      ->delimiter(',')
      ->allow_extra_args(false);
  l->footer(
      "Examples:\n"
      "  kiln checkpoints job-3f9c2a1b7d04\n"
      "  kiln checkpoints job-3f9c2a1b7d04 --kind best,final");
  l->callback([&env, action, list_id, list_kinds] {
    *action = [&env, list_id, list_kinds] { return ListCheckpoints(env, *list_id, *list_kinds); };
  });

  auto take_id = std::make_shared<std::string>();
  CLI::App* t = app.add_subcommand("checkpoint", "Checkpoint a running job now");
  t->add_option("job", *take_id, "Job id")->required();
  t->footer(
      "Answers once the checkpoint is written (after the current step).\n\n"
      "Example:\n  kiln checkpoint job-3f9c2a1b7d04");
  t->callback([&env, action, take_id] {
    *action = [&env, take_id] { return TakeCheckpoint(env, *take_id); };
  });

  auto e_opts = std::make_shared<ExportOptions>();
  CLI::App* e = app.add_subcommand("export", "Download a checkpoint as a safetensors or ONNX file");
  e->add_option("checkpoint", e_opts->ref, "JOB, JOB@ID, JOB@best or JOB@latest (the default)")
      ->required();
  e->add_option("-o,--output-file", e_opts->output,
                "File to write (default JOB-ID.safetensors, or JOB-ID.onnx)");
  e->add_option("--format", e_opts->format,
                "safetensors (the checkpoint as kilnd stores it) or onnx (converted here)")
      ->check(CLI::IsMember({"safetensors", "onnx"}));
  e->add_flag("--force,-f", e_opts->force, "Overwrite the file if it exists");
  e->footer(
      "The file's sha256 is checked against the server's before it is kept (for ONNX, before\n"
      "the conversion; the sha256 shown is the checkpoint's). The ONNX model (opset 13) takes\n"
      "raw pixels 0..255 as UINT8 (table models: raw features as FLOAT) in \"input\", applies\n"
      "the training normalisation itself and answers \"logits\" and \"probabilities\".\n\n"
      "Examples:\n"
      "  kiln export job-3f9c2a1b7d04 -o cnn.safetensors\n"
      "  kiln export job-3f9c2a1b7d04@best -o best.safetensors\n"
      "  kiln export job-3f9c2a1b7d04@3\n"
      "  kiln export job-3f9c2a1b7d04@best --format onnx -o cnn.onnx");
  e->callback(
      [&env, action, e_opts] { *action = [&env, e_opts] { return Export(env, *e_opts); }; });

  auto delete_ref = std::make_shared<std::string>();
  CLI::App* d = app.add_subcommand("delete-checkpoint", "Delete one checkpoint of a job");
  d->add_option("checkpoint", *delete_ref, "JOB@ID (ids from: kiln checkpoints JOB)")->required();
  d->footer(
      "Refused for the checkpoint a queued or running job is to resume from. A model deployed\n"
      "from it keeps serving (its weights are in memory).\n\n"
      "Example:\n  kiln delete-checkpoint job-3f9c2a1b7d04@3");
  d->callback([&env, action, delete_ref] {
    *action = [&env, delete_ref] { return DeleteCheckpoint(env, *delete_ref); };
  });
}

}  // namespace kiln::client
