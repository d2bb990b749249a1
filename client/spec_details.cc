#include "client/spec_details.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/format.h"
#include "client/plain_enum_names.h"

namespace kiln::client {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// One value of `field` (element `index` when repeated, -1 otherwise).
std::string ValueText(const Message& m, const FieldDescriptor* field, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(rep ? r->GetRepeatedInt32(m, field, index) : r->GetInt32(m, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(rep ? r->GetRepeatedInt64(m, field, index) : r->GetInt64(m, field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(rep ? r->GetRepeatedUInt32(m, field, index) : r->GetUInt32(m, field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(rep ? r->GetRepeatedUInt64(m, field, index) : r->GetUInt64(m, field));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return absl::StrCat(rep ? r->GetRepeatedFloat(m, field, index) : r->GetFloat(m, field));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return absl::StrCat(rep ? r->GetRepeatedDouble(m, field, index) : r->GetDouble(m, field));
    case FieldDescriptor::CPPTYPE_BOOL:
      return (rep ? r->GetRepeatedBool(m, field, index) : r->GetBool(m, field)) ? "true" : "false";
    case FieldDescriptor::CPPTYPE_ENUM:
      return PlainEnumName(rep ? r->GetRepeatedEnum(m, field, index) : r->GetEnum(m, field));
    case FieldDescriptor::CPPTYPE_STRING:
      return rep ? r->GetRepeatedString(m, field, index) : r->GetString(m, field);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return absl::StrCat(
          "{", FieldsText(rep ? r->GetRepeatedMessage(m, field, index) : r->GetMessage(m, field)),
          "}");
  }
  return "";
}

// "sgd lr=0.05 momentum=0.9": a message whose `kind` enum says what it is, then its other fields.
std::string KindAndFields(const Message& m) {
  const FieldDescriptor* kind = m.GetDescriptor()->FindFieldByName("kind");
  std::string text = PlainEnumName(m.GetReflection()->GetEnum(m, kind));
  const std::string fields = FieldsText(m, "kind");
  if (!fields.empty()) absl::StrAppend(&text, " ", fields);
  return text;
}

// "linear(in_features=784 out_features=32)", with the node's name and inputs in a graph.
std::string LayerText(const v1::Layer& layer) {
  const FieldDescriptor* kind =
      layer.GetReflection()->GetOneofFieldDescriptor(layer, layer.GetDescriptor()->oneof_decl(0));
  std::string text = kind == nullptr ? "?" : kind->name();
  if (kind != nullptr) {
    const std::string fields = FieldsText(layer.GetReflection()->GetMessage(layer, kind));
    if (!fields.empty()) absl::StrAppend(&text, "(", fields, ")");
  }
  if (!layer.name().empty()) text = absl::StrCat(layer.name(), ": ", text);
  if (layer.inputs_size() > 0) absl::StrAppend(&text, " <- ", absl::StrJoin(layer.inputs(), ", "));
  return text;
}

}  // namespace

std::string FieldsText(const Message& m, const std::string& skip) {
  std::vector<const FieldDescriptor*> fields;
  m.GetReflection()->ListFields(m, &fields);
  std::vector<std::string> words;
  for (const FieldDescriptor* field : fields) {
    if (field->name() == skip) continue;
    if (field->is_repeated()) {
      const int n = m.GetReflection()->FieldSize(m, field);
      std::vector<std::string> items;
      items.reserve(n);
      for (int i = 0; i < n; ++i) items.push_back(ValueText(m, field, i));
      words.push_back(absl::StrCat(field->name(), "=[", absl::StrJoin(items, ","), "]"));
    } else {
      words.push_back(absl::StrCat(field->name(), "=", ValueText(m, field, -1)));
    }
  }
  return absl::StrJoin(words, " ");
}

std::string LabelsText(const v1::JobSpec& spec) {
  if (spec.labels().empty()) return "-";
  const std::map<std::string, std::string> sorted(spec.labels().begin(), spec.labels().end());
  return absl::StrJoin(sorted, ", ", absl::PairFormatter("="));
}

void AddSpecDetails(const v1::JobSpec& spec, const v1::JobSpec& resolved, KeyValueList* kv) {
  // What the spec leaves unset is kilnd's to say (resolved); marked with where it comes from.
  const std::string from =
      spec.preset().empty() ? " (kilnd's default)" : absl::StrCat(" (", spec.preset(), "'s)");
  const std::string unknown =
      spec.preset().empty() ? "-" : absl::StrCat("- (", spec.preset(), "'s; kilnd did not say)");
  if (spec.model().layers_size() > 0) {
    kv->Add("input", absl::StrCat("[", absl::StrJoin(spec.model().input_shape(), ", "), "]"));
    for (int i = 0; i < spec.model().layers_size(); ++i) {
      kv->Add(absl::StrCat("layer ", i + 1), LayerText(spec.model().layers(i)));
    }
  }
  if (spec.optimizer().kind() != v1::OptimizerSpec::KIND_UNSPECIFIED) {
    kv->Add("optimizer", KindAndFields(spec.optimizer()));
  } else if (resolved.optimizer().kind() != v1::OptimizerSpec::KIND_UNSPECIFIED) {
    kv->Add("optimizer", KindAndFields(resolved.optimizer()) + from);
  } else {
    kv->Add("optimizer", unknown);
  }
  kv->Add("schedule", KindAndFields(spec.schedule()));
  const auto* loss_kind = v1::LossKind_descriptor()->FindValueByNumber(spec.loss());
  std::string loss = loss_kind != nullptr ? PlainEnumName(loss_kind) : absl::StrCat(spec.loss());
  if (spec.label_smoothing() > 0) {
    absl::StrAppend(&loss, " label_smoothing=", spec.label_smoothing());
  }
  kv->Add("loss", loss);
  if (spec.batch_size() > 0) {
    kv->Add("batch size", absl::StrCat(spec.batch_size()));
  } else {
    kv->Add("batch size",
            resolved.batch_size() > 0 ? absl::StrCat(resolved.batch_size(), from) : unknown);
  }
  kv->Add("seed", absl::StrCat(spec.seed()));
  if (spec.has_normalization()) {
    kv->Add("normalisation", FieldsText(spec.normalization()));
  } else {
    kv->Add("normalisation",
            resolved.has_normalization() ? FieldsText(resolved.normalization()) + from : unknown);
  }
  const std::string policy = FieldsText(spec.checkpoint_policy());
  kv->Add("checkpointing", policy.empty() ? "at the end, on demand and at shutdown" : policy);
}

}  // namespace kiln::client
