#include "client/command_env.h"

#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace kiln::client {

absl::StatusOr<Connection*> CommandEnv::Connect() {
  if (connection_ == nullptr) {
    absl::StatusOr<std::unique_ptr<Connection>> opened = Connection::Open(connection);
    if (!opened.ok()) return opened.status();
    connection_ = *std::move(opened);
  }
  return connection_.get();
}

std::string MessageToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return "{}";
  // Indented by two, as the other JSON kiln prints (protobuf's own indents by one).
  return pretty ? nlohmann::json::parse(json).dump(2) : json;
}

void PrintJson(const CommandEnv& env, const google::protobuf::Message& message) {
  std::fprintf(env.out, "%s\n", MessageToJson(message).c_str());
}

}  // namespace kiln::client
