"""The naive FastAPI ceiling: what a user writes first, and issue 3 asks torchbay (cnn, c=10,
batch 1, 2 workers) to be at least as fast as. A sync endpoint, so Starlette runs it in its thread
pool, runs the scripted model per request; no batching, no workers, one torch thread. ``POST
/predictions/{model}`` with the raw float32 body answers ``{"class": k, "score": s}``."""

from __future__ import annotations

import argparse

# Module-level imports: FastAPI resolves the endpoints' (string) annotations in these globals.
import torch
from fastapi import Depends, FastAPI, HTTPException, Request

from torchbay.benchmarks.ceilings import serve
from torchbay.benchmarks.models import SAMPLE_SHAPES


async def raw_body(request: Request) -> bytes:
    return await request.body()


def create_app(model_name: str, pt_path: str) -> FastAPI:
    """Load the scripted model at ``pt_path`` and return the app serving it as ``model_name``."""
    torch.set_num_threads(1)
    model = torch.jit.load(pt_path).eval()
    shape = SAMPLE_SHAPES[model_name]
    app = FastAPI()

    @app.post("/predictions/{name}")
    def predict(name: str, body: bytes = Depends(raw_body)) -> dict:
        if name != model_name:
            raise HTTPException(404, f"unknown model {name}")
        x = torch.stack([torch.frombuffer(bytearray(body), dtype=torch.float32).reshape(shape)])
        with torch.inference_mode():
            score, cls = torch.softmax(model(x), dim=1).max(dim=1)
        return {"class": int(cls[0]), "score": float(score[0])}

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=sorted(SAMPLE_SHAPES), required=True)
    parser.add_argument("--pt", required=True, help="TorchScript file (torch.jit.script)")
    raise SystemExit(serve(parser, lambda args: create_app(args.model, args.pt)))
