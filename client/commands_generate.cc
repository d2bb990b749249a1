// kiln generate: text from a deployed language model (a GPT) over kiln.v1.GenerationService,
// each token printed as it comes.
#include <cstdio>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/cli_status.h"
#include "client/command_env.h"
#include "client/interrupt.h"
#include "common/status_macros.h"
#include "kiln/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace kiln::client {
namespace {

struct GenerateOptions {
  std::string model, prompt, version;
  int64_t max_tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 0;
  uint64_t seed = 0;
};

absl::Status Generate(CommandEnv& env, const GenerateOptions& o) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::GenerationService::NewStub(c->channel());
  v1::GenerateRequest request;
  request.set_model_name(o.model);
  request.set_model_version(o.version);
  request.set_text_input(o.prompt);
  request.mutable_parameters()->set_max_tokens(o.max_tokens);
  request.mutable_parameters()->set_temperature(o.temperature);
  request.mutable_parameters()->set_top_k(o.top_k);
  request.mutable_parameters()->set_seed(o.seed);
  // kilnd ends a generation after --web_stream_max_duration (5 minutes by default).
  auto context = c->NewContext(absl::Minutes(30));
  ScopedInterruptHandler on_interrupt([&] { context->TryCancel(); });
  auto reader = stub->Generate(context.get(), request);
  v1::GenerateResponse response;
  std::string text, finish, version;
  bool first = true;
  while (reader->Read(&response)) {
    // The prompt once kilnd has accepted it, so that an error is not printed after it.
    if (first && !env.json()) std::fputs(o.prompt.c_str(), env.out);
    first = false;
    text += response.text_output();
    version = response.model_version();
    if (!response.finish_reason().empty()) finish = response.finish_reason();
    if (!env.json()) {
      std::fputs(response.text_output().c_str(), env.out);
      std::fflush(env.out);
    }
  }
  grpc::Status status = reader->Finish();
  if (!first && !env.json()) std::fputc('\n', env.out);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    nlohmann::json out = {{"model_name", o.model},
                          {"model_version", version},
                          {"prompt", o.prompt},
                          {"text_output", text},
                          {"finish_reason", finish}};
    std::fprintf(env.out, "%s\n",
                 out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

void AddGenerateCommand(CLI::App& app, CommandEnv& env, Action* action) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* g = app.add_subcommand("generate", "Generate text with a deployed language model");
  g->add_option("model", o->model, "Model name")->required();
  g->add_option("prompt", o->prompt, "The text to continue (in the model's vocabulary)")
      ->required();
  g->add_option("--max-tokens", o->max_tokens, "Tokens to generate (default 200)")
      ->check(CLI::PositiveNumber);
  g->add_option("--temperature", o->temperature,
                "Sampling temperature: 0 greedy, < 1 sharper, > 1 flatter (default 0.8)")
      ->check(CLI::NonNegativeNumber);
  g->add_option("--top-k", o->top_k, "Sample among the k likeliest tokens (default 0: all)")
      ->check(CLI::NonNegativeNumber);
  g->add_option("--seed", o->seed, "The draws' seed: the same seed gives the same text");
  g->add_option("--version", o->version, "Model version (default: the latest)");
  g->footer(
      "Examples:\n"
      "  kiln generate shakespeare \"ROMEO:\" --max-tokens 300\n"
      "  kiln generate shakespeare \"To be\" --temperature 0 --output json");
  g->callback([&env, action, o] { *action = [&env, o] { return Generate(env, *o); }; });
}

}  // namespace kiln::client
