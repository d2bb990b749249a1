#include "server/web/api_replies.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include "server/http/http_server.h"
#include "server/http/status_mapping.h"

namespace kiln::web {

std::string ProtoJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Our own messages always convert; an error would leave "{}" rather than a broken body.
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) return "{}";
  return out;
}

void ReplyJson(httplib::Response& res, const std::string& body) {
  res.status = 200;
  res.set_content(body, "application/json");
}

void ReplyStatus(httplib::Response& res, const absl::Status& status) {
  http::ReplyStatus(res, status);
}

}  // namespace kiln::web
