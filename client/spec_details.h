// A job spec's hyperparameters as `kiln get` lists them: the model's layers, the optimizer, the
// schedule, the loss, batch size, seed, normalisation and checkpoint policy, with what kilnd
// resolved filled in where the spec leaves it to a preset.
#pragma once

#include <string>

#include "client/table.h"
#include "google/protobuf/message.h"
#include "kiln/v1/model_spec.pb.h"

namespace kiln::client {

// The fields set in `m` as "name=value" words in field order, enums by their plain names,
// repeated fields as [a,b]; `skip` names a field left out. "lr=0.05 momentum=0.9".
std::string FieldsText(const google::protobuf::Message& m, const std::string& skip = "");

// "team=vision, owner=ana", keys sorted; "-" when there are none.
std::string LabelsText(const v1::JobSpec& spec);

// Adds the hyperparameter lines of `spec` to `kv`. What the spec leaves unset (optimizer, batch
// size, normalisation) comes from `resolved`, kilnd's Job.resolved_spec, marked "(PRESET's)" or
// "(kilnd's default)"; a kilnd too old to send it leaves those lines saying so.
void AddSpecDetails(const v1::JobSpec& spec, const v1::JobSpec& resolved, KeyValueList* kv);

}  // namespace kiln::client
