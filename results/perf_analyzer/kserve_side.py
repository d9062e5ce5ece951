"""KServe's Python model server with a minimal predictor for results/perf_analyzer/run.py, plus the
one answer KServe lacks and perf_analyzer asks first (the v2 model config, REST and gRPC).

    python results/perf_analyzer/kserve_side.py MODEL.pt HTTP_PORT GRPC_PORT
"""

from __future__ import annotations

import logging
import sys

from run import CONFIG, IN, MODEL, OUT  # this folder is sys.path[0] when run as a script


def kserve_serve(model_path: str, http_port: int, grpc_port: int) -> None:
    """KServe's ModelServer with a minimal predictor, plus the one model-config answer."""
    import torch
    from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

    torch.set_num_threads(1)

    class Predictor(Model):
        def __init__(self) -> None:
            super().__init__(MODEL)
            self.net = torch.jit.load(model_path).eval()
            self.ready = True

        def get_input_types(self) -> list[dict]:
            return [{"name": "x", "datatype": "FP32", "shape": [-1, IN]}]

        def get_output_types(self) -> list[dict]:
            return [{"name": "y", "datatype": "FP32", "shape": [-1, OUT]}]

        def predict(
            self, payload: InferRequest, headers=None, response_headers=None
        ) -> InferResponse:
            with torch.inference_mode():
                y = self.net(torch.from_numpy(payload.inputs[0].as_numpy())).numpy()
            out = InferOutput(name="y", shape=list(y.shape), datatype="FP32")
            out.set_data_from_numpy(y)
            # Binary or JSON outputs as the request asks (perf_analyzer asks for binary ones).
            return InferResponse(
                payload.id,
                MODEL,
                [out],
                from_grpc=payload.from_grpc,
                use_binary_outputs=payload.use_binary_outputs,
                requested_outputs=payload.request_outputs,
            )

    _add_model_config()
    server = ModelServer(http_port, grpc_port, workers=1, enable_latency_logging=False)
    # No access log, as torchbay runs with access_log=false: KServe's logging is set up by
    # ModelServer's constructor, so uvicorn's access logger is silenced after it.
    # KServe's gRPC interceptor ("kserve") and its REST timing middleware ("kserve.trace") log
    # every call at INFO: silenced too.
    for name in ("uvicorn.access", "kserve", "kserve.trace"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([Predictor()])


def _add_model_config() -> None:
    """``GET /v2/models/model/config`` and the ``ModelConfig`` RPC, which KServe lacks: the route
    goes on KServe's module-level FastAPI app, the RPC on its gRPC server beside KServe's own
    handlers (a second generic handler for the same service answers only that method)."""
    import grpc
    from google.protobuf import json_format
    from kserve import model_server
    from kserve.protocol.grpc import server as kserve_grpc

    from torchbay.server.grpc.messages import message

    model_server.app.add_api_route(f"/v2/models/{MODEL}/config", lambda: CONFIG, methods=["GET"])
    response = message("inference.ModelConfigResponse")()
    json_format.ParseDict({"config": CONFIG}, response)
    answer = response.SerializeToString()

    async def model_config(request: bytes, context: object) -> bytes:
        return answer  # async: KServe's interceptors await every handler

    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelConfig": grpc.unary_unary_rpc_method_handler(model_config)},
    )
    kserve_add = kserve_grpc.grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server

    def add_with_config(servicer, server) -> None:
        kserve_add(servicer, server)
        server.add_generic_rpc_handlers((handler,))

    kserve_grpc.grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server = (
        add_with_config
    )


if __name__ == "__main__":
    kserve_serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
