"""Record TorchServe 0.12's answers to the stateful example (sequence continuous batching) as
test data.

Run from the repository root with torchbay's environment (the clients need grpcio and torch;
TorchServe and its archiver run from /work/ts-venv):
    .venv/bin/python tests/data/torchserve/stateful/record_continuous.py OUT.json [idle60s]
It archives the example unchanged (plus lru.py, see README.md; with ``idle60s``, its
model-config.yaml with ``sequenceMaxIdleMSec: 60000`` instead of 10), starts TorchServe on ports
18300-18302 (gRPC 18305-18306), runs the scenarios below and writes every answer (status, the
sequence headers, body or streamed chunks, gRPC responses) to OUT.json."""

import http.client
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
# TorchServe's stateful example, copied unchanged (this folder holds our lru.py and records).
EXAMPLE = HERE.parents[2] / "third_party" / "torchserve" / "stateful"
COMMAND = ".venv/bin/python tests/data/torchserve/stateful/record_continuous.py OUT.json"
# The example's idle limit, 10 ms, closes a sequence between two requests of one client (the
# next one may then land on the other worker); ``idle60s`` records with the 60 s limit that the
# example's Readme.md shows, the rest of the file unchanged.
IDLE_10MS, IDLE_60S = "sequenceMaxIdleMSec: 10\n", "sequenceMaxIdleMSec: 60000\n"
HOST, PORT, MGMT_PORT, GRPC_PORT = "127.0.0.1", 18300, 18301, 18305
SEQ = "ts_request_sequence_id"


def post(body, headers=None, stream=False):
    """One POST /predictions/stateful: (status, sequence headers, body or list of chunks)."""
    conn = http.client.HTTPConnection(HOST, PORT, timeout=60)
    try:
        conn.request("POST", "/predictions/stateful", body=body, headers=headers or {})
        r = conn.getresponse()
        seq_headers = {k: v for k, v in r.getheaders() if "sequence" in k.lower()}
        if not stream:
            return r.status, seq_headers, r.read().decode()
        chunks = []
        while chunk := r.read1(65536):
            chunks.append(chunk.decode())
        return r.status, seq_headers, chunks
    finally:
        conn.close()


def answer(request, status, headers, body):
    return {"request": request, "status": status, "headers": headers, "body": body}


def two_sequences():
    """TorchServe's test_infer_stateful: two sequences at once, each started without an id
    (the server names it), then 4 more numbers (seq_0: 2, 4, .. 10; seq_1: 4, 8, .. 20)."""
    out = {}

    def run(name, step):
        answers, headers = [], {}
        for i in range(1, 6):
            status, seq_headers, body = post(str(step * i).encode(), headers)
            answers.append(
                answer({"body": str(step * i), "with_id": bool(headers)}, status, seq_headers, body)
            )
            if SEQ in seq_headers:
                headers = {SEQ: seq_headers[SEQ]}
        out[name] = answers

    threads = [threading.Thread(target=run, args=a) for a in (("seq_0", 2), ("seq_1", 4))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def end_then_more():
    """A sequence ended by its handler (input 0), then one more request with its id."""
    status, headers, body = post(b"2")
    sid = headers.get(SEQ)
    answers = [answer({"body": "2"}, status, headers, body)]
    if sid is None:  # the sequence was not opened (recorded as answered)
        return answers
    for n in ("4", "0", "5"):
        status, h, body = post(n.encode(), {SEQ: sid})
        answers.append(answer({"body": n, "with_id": True}, status, h, body))
    return answers


def cancel():
    """TorchServe's test_infer_stateful_cancel: a streaming request ({"input": 3}) and, 1 s
    later, a cancel (-1) of the same sequence; then 0 closes the sequence."""
    status, headers, body = post(b"2")
    sid = headers.get(SEQ)
    out = {"start": answer({"body": "2"}, status, headers, body)}
    if sid is None:  # the sequence was not opened (recorded as answered)
        return out

    def streaming():
        status, h, chunks = post(
            json.dumps({"input": 3}).encode(),
            {SEQ: sid, "Content-Type": "application/json"},
            stream=True,
        )
        out["stream"] = answer({"json": {"input": 3}}, status, h, chunks)

    def cancelling():
        time.sleep(1)
        status, h, body = post(b"-1", {SEQ: sid})
        out["cancel"] = answer({"body": "-1"}, status, h, body)

    threads = [threading.Thread(target=f) for f in (streaming, cancelling)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    status, h, body = post(b"0", {SEQ: sid})
    out["close"] = answer({"body": "0"}, status, h, body)
    return out


def grpc_readme(stubs):
    """The README's gRPC client: infer_stream2 stateful seq_0 sample1.txt,sample2.txt,sample3.txt
    (all three sent at once on one StreamPredictions2 stream, then the answers read)."""
    import grpc

    channel = grpc.insecure_channel(f"{HOST}:{GRPC_PORT}")
    stub = stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    requests = queue.Queue()
    for i in (1, 2, 3):
        data = (EXAMPLE / "sample" / f"sample{i}.txt").read_bytes()
        requests.put(
            stubs.inference_pb2.PredictionsRequest(
                model_name="stateful", sequence_id="seq_0", input={"data": data}
            )
        )
    requests.put(None)
    out = []
    try:
        for response in stub.StreamPredictions2(iter(requests.get, None), timeout=60):
            out.append(
                {
                    "prediction": response.prediction.decode(),
                    "sequence_id": response.sequence_id,
                    "status": {"code": response.status.code, "message": response.status.message}
                    if response.HasField("status")
                    else None,
                }
            )
    except grpc.RpcError as exc:
        out.append({"rpc_error": str(exc.code()), "details": exc.details()})
    finally:
        channel.close()
    return out


def stubs():
    sys.path.insert(0, str(HERE.parents[3]))
    sys.path.insert(0, str(HERE.parents[3] / "tests" / "server"))
    from conftest import ts_stubs

    return next(ts_stubs.__wrapped__())


def archive(work, idle60s):
    sys.path.insert(0, str(EXAMPLE))
    from model import Net

    torch.manual_seed(0)
    torch.save(Net().state_dict(), work / "model_cnn.pt")
    store = work / "store"
    store.mkdir()
    example = EXAMPLE / "sequence_continuous_batching"
    config = example / "model-config.yaml"
    if idle60s:
        text = config.read_text()
        assert IDLE_10MS in text
        config = work / "model-config.yaml"
        config.write_text(text.replace(IDLE_10MS, IDLE_60S))
    subprocess.run(
        [
            "/work/ts-venv/bin/torch-model-archiver",
            "--model-name",
            "stateful",
            "--version",
            "1.0",
            "--model-file",
            str(EXAMPLE / "model.py"),
            "--serialized-file",
            str(work / "model_cnn.pt"),
            "--handler",
            str(example / "stateful_handler.py"),
            "--extra-files",
            str(HERE / "lru.py"),
            "--config-file",
            str(config),
            "--export-path",
            str(store),
        ],
        check=True,
    )
    return store


def main(out, idle60s=False):
    work = Path(tempfile.mkdtemp())
    store = archive(work, idle60s)
    (work / "config.properties").write_text(
        f"inference_address=http://{HOST}:{PORT}\nmanagement_address=http://{HOST}:{MGMT_PORT}\n"
        f"metrics_address=http://{HOST}:18302\ngrpc_inference_port={GRPC_PORT}\n"
        "grpc_management_port=18306\n"
    )
    subprocess.run(
        [
            "/work/ts-venv/bin/torchserve",
            "--start",
            "--ncs",
            "--disable-token-auth",
            "--model-store",
            str(store),
            "--models",
            "stateful=stateful.mar",
            "--ts-config",
            str(work / "config.properties"),
        ],
        check=True,
        cwd=work,
    )
    try:
        for _ in range(240):
            try:
                conn = http.client.HTTPConnection(HOST, MGMT_PORT, timeout=5)
                conn.request("GET", "/models/stateful")
                if '"READY"' in conn.getresponse().read().decode():
                    break
            except OSError:
                pass
            time.sleep(0.5)
        command = COMMAND + (" idle60s" if idle60s else "")
        result = {
            "command": command,
            "torchserve": "0.12",
            "config": "idle60s" if idle60s else "file",
        }
        result["two_sequences"] = two_sequences()
        result["end_then_more"] = end_then_more()
        result["cancel"] = cancel()
        result["grpc_readme"] = grpc_readme(stubs())
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        subprocess.run(["/work/ts-venv/bin/torchserve", "--stop"], cwd=work)
        print("logs in", work / "logs")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["idle60s"])
