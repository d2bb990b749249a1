// How the web API's routes answer: messages as proto3 JSON, and errors as {"error": ...} with
// the HTTP status and the words of the gRPC side.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace httplib {
struct Response;
}  // namespace httplib

namespace kiln::web {

// snake_case names, enums by name, 64-bit integers as strings, every field written.
std::string ProtoJson(const google::protobuf::Message& message);
// 200 with `body` as application/json.
void ReplyJson(httplib::Response& res, const std::string& body);
// The error as the gRPC path words it (server paths shown by their folder names).
void ReplyStatus(httplib::Response& res, const absl::Status& status);
// The message as JSON, or the error.
template <typename Message>
void ReplyMessage(httplib::Response& res, const absl::StatusOr<Message>& message) {
  if (!message.ok()) {
    ReplyStatus(res, message.status());
    return;
  }
  ReplyJson(res, ProtoJson(*message));
}

}  // namespace kiln::web
