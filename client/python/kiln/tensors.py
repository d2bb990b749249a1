"""numpy arrays to and from KServe v2 tensors: the request's input and the response's
probabilities and classes."""
import math

import numpy as np

from kiln.errors import KilnError
from kiln.stubs import inference_pb2


def infer_request(model, version, input_name, sample_shape, array):
    """A ModelInferRequest carrying `array` in raw_input_contents: UINT8 for a uint8 array
    (raw pixels, which the model normalises as in training), FP32 for anything else (pixels in
    [0, 1] or a table's features). The batch dimension comes first; a single sample may come
    without it. Raises KilnError INVALID_ARGUMENT when the values do not split into samples of
    the model's size."""
    array = np.asarray(array)
    per_sample = math.prod(max(d, 1) for d in sample_shape)
    if array.ndim == 0 or array.size == 0:
        raise KilnError("INVALID_ARGUMENT", f"predict: an empty array for model {model}")
    if math.prod(array.shape[1:]) == per_sample:
        batch = array.shape[0]
    elif array.size == per_sample:
        batch = 1  # one sample, without its batch dimension
    else:
        raise KilnError(
            "INVALID_ARGUMENT",
            f"predict: an array of shape {array.shape} does not split into samples of "
            f"{'x'.join(map(str, sample_shape))} ({per_sample} values), as model {model} takes")
    if array.dtype == np.uint8:
        datatype, data = "UINT8", np.ascontiguousarray(array)
    else:
        datatype, data = "FP32", np.ascontiguousarray(array, dtype="<f4")
    request = inference_pb2.ModelInferRequest(model_name=model, model_version=version)
    tensor = request.inputs.add(name=input_name, datatype=datatype)
    tensor.shape.extend([batch, *sample_shape])
    request.raw_input_contents.append(data.tobytes())
    return request


def _output(response, name, datatype):
    """Output `name` of `response` as a flat array (raw contents or typed), or None."""
    for i, out in enumerate(response.outputs):
        if out.name != name:
            continue
        if i < len(response.raw_output_contents):
            return np.frombuffer(response.raw_output_contents[i], dtype=datatype).copy()
        typed = out.contents.fp32_contents if datatype == "<f4" else out.contents.int64_contents
        return np.array(typed, dtype=datatype)
    return None


def infer_result(model, response, batch):
    """(probabilities float32 [batch, classes], classes int64 [batch]) from a
    ModelInferResponse; classes from the `class` output, or the most probable where the server
    sent none."""
    probabilities = _output(response, "probabilities", "<f4")
    if probabilities is None or batch == 0 or probabilities.size % batch != 0:
        raise KilnError("DATA_LOSS", f"model {model}'s answer has no \"probabilities\" output "
                        f"for {batch} samples")
    probabilities = probabilities.reshape(batch, -1)
    classes = _output(response, "class", "<i8")
    if classes is None or classes.size != batch:
        classes = probabilities.argmax(axis=1).astype(np.int64)
    return probabilities, classes
