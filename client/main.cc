// kiln: the command-line client of kilnd. Wires the global flags and the subcommands together,
// runs the chosen one and turns its outcome into an exit code.
#include <grpc/support/log.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "CLI/CLI.hpp"
#include "client/cli_status.h"
#include "client/command_env.h"
#include "client/interrupt.h"

int main(int argc, char** argv) {
  kiln::client::InstallInterruptHandling();
  // gRPC's own log lines (a failed TLS handshake, say) repeat less clearly what kiln reports;
  // setting GRPC_VERBOSITY brings them back.
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function([](gpr_log_func_args*) {});
  kiln::client::CommandEnv env;
  kiln::client::Action action;

  CLI::App app{"kiln: train, watch, checkpoint and serve models on a kilnd daemon.", "kiln"};
  app.require_subcommand(1);
  app.fallthrough();
  app.add_option("--server,-s", env.connection.server, "kilnd's HOST:PORT")
      ->envname("KILN_SERVER")
      ->capture_default_str();
  app.add_option("--token", env.connection.token, "Bearer token for kilnd's auth")
      ->envname("KILN_TOKEN");
  app.add_option("--tls-ca", env.connection.tls_ca, "PEM file of the CA to verify kilnd's TLS")
      ->envname("KILN_TLS_CA")
      ->check(CLI::ExistingFile);
  CLI::Option* tls_cert =
      app.add_option("--tls-cert", env.connection.tls_cert,
                     "PEM client certificate, for a kilnd with mutual TLS (needs --tls-key)")
          ->envname("KILN_TLS_CERT")
          ->check(CLI::ExistingFile);
  CLI::Option* tls_key =
      app.add_option("--tls-key", env.connection.tls_key, "PEM private key of --tls-cert")
          ->envname("KILN_TLS_KEY")
          ->check(CLI::ExistingFile);
  tls_cert->needs(tls_key);
  tls_key->needs(tls_cert);
  app.add_option("--tls-server-name", env.connection.tls_server_name,
                 "Name to verify kilnd's certificate for, when it differs from the --server host")
      ->envname("KILN_TLS_SERVER_NAME");
  app.add_option("--output", env.output, "Output format: table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();

  kiln::client::AddJobCommands(app, env, &action);
  kiln::client::AddCheckpointCommands(app, env, &action);
  kiln::client::AddDatasetCommands(app, env, &action);
  kiln::client::AddServingCommands(app, env, &action);
  kiln::client::AddGenerateCommand(app, env, &action);
  kiln::client::AddHealthCommand(app, env, &action);
  kiln::client::AddWhoAmICommand(app, env, &action);
  app.footer(
      "Exit codes: 0 ok, 1 the server said no (or the job failed), 2 bad usage.\n\n"
      "Examples:\n"
      "  kiln submit --preset mnist-cnn --epochs 1 --watch\n"
      "  kiln jobs\n"
      "  kiln deploy job-3f9c2a1b7d04 --name digits\n"
      "  kiln predict digits seven.png\n"
      "Run 'kiln COMMAND --help' for a command's options and examples.");

  // CLI11 answers an unknown command with "A subcommand is required"; name it instead.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (!arg.empty() && arg[0] == '-') {
      const bool takes_value = arg == "--server" || arg == "-s" || arg == "--token" ||
                               arg == "--tls-ca" || arg == "--tls-cert" || arg == "--tls-key" ||
                               arg == "--tls-server-name" || arg == "--output";
      if (takes_value) ++i;
      continue;
    }
    const auto commands = app.get_subcommands([&arg](CLI::App* c) { return c->check_name(arg); });
    if (commands.empty()) {
      std::fprintf(stderr, "kiln: unknown command \"%s\"\nRun 'kiln --help' for the commands.\n",
                   arg.c_str());
      return static_cast<int>(kiln::client::ExitCode::kUsage);
    }
    break;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and version print to stdout and exit 0; every other parse error is bad usage.
    const int code = app.exit(e);
    return code == 0 ? 0 : static_cast<int>(kiln::client::ExitCode::kUsage);
  }
  if (!action) {
    std::fprintf(stderr, "kiln: no command given\nRun with --help for more information.\n");
    return static_cast<int>(kiln::client::ExitCode::kUsage);
  }
  const int code = kiln::client::ReportStatus(action(), stderr);
  std::fflush(stdout);
  return code;
}
