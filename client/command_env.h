// What every kiln command shares: the global flags, the output format and the lazily opened
// connection to kilnd.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/connection.h"
#include "google/protobuf/message.h"

namespace CLI {
class App;
}

namespace kiln::client {

enum class OutputFormat { kTable, kJson };

// The global state of one kiln invocation. Commands print results to `out` and progress and
// notes to `err`.
struct CommandEnv {
  ConnectionOptions connection;
  std::string output = "table";  // --output: "table" or "json"
  std::FILE* out = stdout;
  std::FILE* err = stderr;

  OutputFormat format() const {
    return output == "json" ? OutputFormat::kJson : OutputFormat::kTable;
  }
  bool json() const { return format() == OutputFormat::kJson; }

  // Opens the connection on first use and keeps it.
  absl::StatusOr<Connection*> Connect();

 private:
  std::unique_ptr<Connection> connection_;
};

// The command chosen on the command line, run after parsing.
using Action = std::function<absl::Status()>;

// A message as JSON (proto3 mapping, every field printed); `pretty` indents it over lines.
std::string MessageToJson(const google::protobuf::Message& message, bool pretty = true);
// Prints `message` to env.out as JSON, one value followed by a newline.
void PrintJson(const CommandEnv& env, const google::protobuf::Message& message);

// Each adds its subcommands to `app`; the chosen one stores what it runs in `*action`.
void AddJobCommands(CLI::App& app, CommandEnv& env, Action* action);
void AddCheckpointCommands(CLI::App& app, CommandEnv& env, Action* action);
void AddDatasetCommands(CLI::App& app, CommandEnv& env, Action* action);
void AddServingCommands(CLI::App& app, CommandEnv& env, Action* action);
void AddHealthCommand(CLI::App& app, CommandEnv& env, Action* action);
void AddWhoAmICommand(CLI::App& app, CommandEnv& env, Action* action);
void AddGenerateCommand(CLI::App& app, CommandEnv& env, Action* action);

}  // namespace kiln::client
