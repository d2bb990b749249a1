"""Job specs from what Python users have at hand: a dict in the JSON form of examples/*.json, a
preset name, a .json file or a JobSpec, plus keyword overrides as `kiln submit`'s flags."""
import json
import os

from google.protobuf import json_format

from kiln.errors import KilnError
from kiln.stubs import spec_pb2

PRESETS = ("mnist-mlp", "mnist-cnn")
# The presets' optimizers, as model_spec.proto documents them: lr= on a preset spells its
# optimizer out, because kilnd takes a partial optimizer as a whole one.
_PRESET_OPTIMIZERS = {
    "mnist-mlp": {"kind": "KIND_SGD", "momentum": 0.9},
    "mnist-cnn": {"kind": "KIND_ADAM"},
}


def _shared_prefix(names):
    """The prefix all `names` share up to a '_': "KIND_" for KIND_SGD, KIND_ADAM."""
    prefix = os.path.commonprefix(list(names))
    return prefix[:prefix.rfind("_") + 1]


def _plain_enum_names(value, descriptor, path="spec"):
    """`value` (a dict of the JSON form of `descriptor`) with enum values also accepted by their
    plain names, any case: "adam" for "KIND_ADAM", "cross_entropy" for
    "LOSS_KIND_CROSS_ENTROPY": a value's plain name, or a suffix that ends exactly one name. An unknown
    name is INVALID_ARGUMENT naming the field by `path` and the accepted names, as the CLI says it."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, v in value.items():
        field = descriptor.fields_by_name.get(key) or next(
            (f for f in descriptor.fields if f.json_name == key), None)
        if field is None:
            out[key] = v
        elif field.enum_type is not None and isinstance(v, str):
            names = field.enum_type.values_by_name
            wanted = v.upper()
            # A value's own plain name wins over suffixes ("cosine" is KIND_COSINE, though it
            # also ends KIND_WARMUP_COSINE), as in the CLI.
            prefix = _shared_prefix(names)
            matches = [n for n in names if n == prefix + wanted]
            if not matches:
                matches = [n for n in names if n == wanted or n.endswith("_" + wanted)]
            if v not in names and len(matches) != 1:
                # As the kiln CLI says it: the plain names, UNSPECIFIED left out.
                ordered = [x.name for x in field.enum_type.values]  # by number, as declared
                plain = [n[len(_shared_prefix(ordered)):].lower() for n in ordered
                         if not n.endswith("_UNSPECIFIED")]
                raise KilnError("INVALID_ARGUMENT",
                                f"{path}.{field.name}: unknown value \"{v}\"; expected "
                                f"{', '.join(plain[:-1])} or {plain[-1]}")
            out[key] = v if v in names else matches[0]
        elif field.message_type is not None:
            if field.label == field.LABEL_REPEATED and isinstance(v, list):
                out[key] = [_plain_enum_names(x, field.message_type, f"{path}.{field.name}[{i}]")
                            for i, x in enumerate(v)]
            else:
                out[key] = _plain_enum_names(v, field.message_type, f"{path}.{field.name}")
        else:
            out[key] = v
    return out


def _from_dict(d, source):
    try:
        return json_format.ParseDict(_plain_enum_names(d, spec_pb2.JobSpec.DESCRIPTOR),
                                     spec_pb2.JobSpec())
    except json_format.ParseError as e:
        raise KilnError("INVALID_ARGUMENT", f"{source}: not a valid JobSpec: {e}") from None


def build_spec(spec=None, **overrides):
    """A JobSpec from `spec` (dict, preset name, path of a .json file, JobSpec or None) with
    `overrides` applied: dataset, epochs, batch_size, lr, seed, device, preset, or any other
    JobSpec field by name (optimizer={...}, label_smoothing=0.1, precision="bf16", ...). As
    `kiln submit`, the dataset defaults to "mnist" and the epochs to 1 when neither the spec nor
    overrides set them (nor max_iters, a language model's run)."""
    if spec is None:
        message = spec_pb2.JobSpec()
    elif isinstance(spec, spec_pb2.JobSpec):
        message = spec_pb2.JobSpec()
        message.CopyFrom(spec)
    elif isinstance(spec, dict):
        message = _from_dict(spec, "spec")
    elif isinstance(spec, (str, os.PathLike)) and str(spec).endswith(".json"):
        try:
            with open(spec, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise KilnError("INVALID_ARGUMENT", f"cannot read spec file {spec}: {e}") from None
        message = _from_dict(d, str(spec))
    elif isinstance(spec, str):
        message = spec_pb2.JobSpec(preset=spec)
    else:
        raise KilnError("INVALID_ARGUMENT",
                        f"spec: a dict, a preset name ({', '.join(PRESETS)}), a .json file or a "
                        f"JobSpec, not {type(spec).__name__}")

    lr = overrides.pop("lr", None)
    rest = {k: v for k, v in overrides.items() if v is not None}
    unknown = [k for k in rest if k not in spec_pb2.JobSpec.DESCRIPTOR.fields_by_name]
    if unknown:
        raise KilnError("INVALID_ARGUMENT",
                        f"unknown override {', '.join(unknown)}: not a JobSpec field (see "
                        "proto/kiln/v1/model_spec.proto)")
    if rest:
        # Set fields replace the spec's, as a flag replaces a file's value in `kiln submit`.
        for key in rest:
            message.ClearField(key)
        message.MergeFrom(_from_dict(rest, "overrides"))
    if not message.dataset:
        message.dataset = "mnist"
    if message.epochs == 0 and message.max_iters == 0:  # a language model counts iterations
        message.epochs = 1
    if lr is not None:
        if message.optimizer.kind == spec_pb2.OptimizerSpec.KIND_UNSPECIFIED:
            preset = _PRESET_OPTIMIZERS.get(message.preset)
            if preset is None:
                raise KilnError("INVALID_ARGUMENT",
                                "lr= needs an optimizer: give the spec an optimizer kind or a "
                                f"preset ({', '.join(PRESETS)})")
            json_format.ParseDict(preset, message.optimizer)
        message.optimizer.lr = float(lr)
    return message
