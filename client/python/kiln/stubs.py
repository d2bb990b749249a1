"""The generated protobuf modules and gRPC stubs, imported in one place so that a source checkout
without them says how to get them instead of failing deep in an import chain."""
try:
    from kiln.inference import grpc_service_pb2 as inference_pb2
    from kiln.inference import grpc_service_pb2_grpc as inference_grpc
    from kiln.v1 import generation_pb2
    from kiln.v1 import generation_pb2_grpc as generation_grpc
    from kiln.v1 import model_spec_pb2 as spec_pb2
    from kiln.v1 import training_pb2
    from kiln.v1 import training_pb2_grpc as training_grpc
except ImportError as e:  # pragma: no cover - depends on how the package was put on the path
    raise ImportError(
        f"kiln: the generated gRPC modules are missing ({e}). Build them with "
        "`cmake --build build --target kiln_python_client` and put build/python, not "
        "client/python, on PYTHONPATH (the build copies the package there with them)") from e

__all__ = ["generation_pb2", "generation_grpc", "inference_pb2", "inference_grpc", "spec_pb2", "training_pb2", "training_grpc"]
