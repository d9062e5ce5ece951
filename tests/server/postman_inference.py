"""TorchServe's own Postman inference collection (test/postman/inference_api_test_collection.json
and inference_data.json of TorchServe 0.12, copied unchanged to
tests/third_party/torchserve/postman/), replayed as newman runs it: for each row of the data file,
the collection's four requests in order (register the row's archive with ``initial_workers`` and
``synchronous``, POST the row's file to ``/predictions/{model_name}``, unregister, scrape
``/metrics``) and the checks of each request's test script (the status codes, the expected text of
``text/plain`` rows, the metrics pattern).

The zoo's archives hold pretrained ImageNet, COCO and BERT weights, downloaded from
torchserve.pytorch.org: this machine has no internet, and TorchServe's built-in vision handlers
need torchvision, which has no CPU build here. So the replay serves stand-ins under the
environment's ``mar_path_*`` names (``stand_ins``: a tiny TorchScript model with the output shape
of each handler TorchServe's archive names: ``image_classifier``, ``object_detector``,
``image_segmenter``) and a generated JPEG for each of the collection's images; the
pretrained-weight checks (``expected`` probabilities with ``tolerance``) cannot hold on a
stand-in and are not made. Rows whose archive is a URL cannot download offline: ``OFFLINE``.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import httpx
import torch

from tests.server.postman_replay import COLLECTIONS, build_zoo, environment, substitute

# The data rows' archives, by the built-in handler TorchServe's zoo archive uses.
CLASSIFIERS = ("squeezenet1_1", "densenet161", "alexnet", "resnet-18", "vgg16", "resnet-152-batch")
DETECTORS = ("fastrcnn", "maskrcnn")
SEGMENTERS = ("fcn_resnet_101", "deeplabv3_resnet_101_eager")


def rows() -> list[dict[str, Any]]:
    return json.loads((COLLECTIONS / "inference_data.json").read_text())


def metrics_pattern() -> re.Pattern[str]:
    """The regular expression of the collection's "Model Metrics" test, read from its script."""
    collection = json.loads((COLLECTIONS / "inference_api_test_collection.json").read_text())
    [item] = [i for i in collection["item"] if i["name"].endswith("Model Metrics")]
    script = "\n".join(item["event"][0]["script"]["exec"])
    source = re.search(r"new RegExp\('(.*)'\)", script).group(1)
    return re.compile(source.replace("\\\\", "\\"))


class _Detector(torch.nn.Module):
    """torchvision's detection output: a box over each image, scored by its brightness."""

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        out: list[dict[str, torch.Tensor]] = []
        for image in images:
            box = torch.tensor([[0.0, 0.0, float(image.shape[-1]), float(image.shape[-2])]])
            out.append({"boxes": box, "labels": torch.tensor([1]), "scores": image.mean()[None]})
        return out


class _Segmenter(torch.nn.Module):
    """torchvision's segmentation output: ``{"out": N x 21 x H x W}``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 21, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.conv(x)}


def stand_ins(store: Path) -> Path:
    """``build_zoo``'s classifiers, plus a detector and a segmenter under the collection's names."""
    from torchbay.archiver.package import ArchiveOptions, package

    build_zoo(store, names=CLASSIFIERS)
    torch.manual_seed(0)
    for names, model, handler in (
        (DETECTORS, _Detector(), "object_detector"),
        (SEGMENTERS, _Segmenter(), "image_segmenter"),
    ):
        path = store / f"{handler}.pt"
        torch.jit.script(model.eval()).save(str(path))
        for name in names:
            options = ArchiveOptions(
                model_name=name,
                version="1.0",
                serialized_file=path,
                handler=handler,
                export_path=store,
                force=True,
            )
            package(options)
        path.unlink()
    return store


def image(size: tuple[int, int]) -> bytes:
    """A JPEG of ``size``, a gradient (the collection's kitten.jpg and persons.jpg stand-in)."""
    from PIL import Image

    picture = Image.linear_gradient("L").resize(size).convert("RGB")
    buf = io.BytesIO()
    picture.save(buf, format="JPEG")
    return buf.getvalue()


def replay(urls: dict[str, str], timeout: float = 180.0) -> list[dict[str, Any]]:
    """Every data row through the collection's four requests against ``urls`` (``inference``,
    ``management``, ``metrics``: ``http://host:port``): each step's status, the checks the
    collection makes, and the answers' first 200 characters."""
    env = environment()
    pattern = metrics_pattern()
    files = {"kitten.jpg": image((640, 480)), "persons.jpg": image((500, 375))}
    out = []
    with httpx.Client(timeout=timeout) as client:
        for index, row in enumerate(rows()):
            url = substitute(row["url"], env)
            params = {
                "url": url,
                "model_name": row["model_name"],
                "initial_workers": row["worker"],
                "synchronous": row["synchronous"],
            }
            body = files.get(Path(row["file"]).name, b"")
            steps = [
                client.post(f"{urls['management']}/models", params=params),
                client.post(f"{urls['inference']}/predictions/{row['model_name']}", content=body),
                client.delete(f"{urls['management']}/models/{row['model_name']}"),
                client.get(f"{urls['metrics']}/metrics"),
            ]
            out.append(
                {
                    "row": index,
                    "model": row["model_name"],
                    "url": url,
                    "status": [r.status_code for r in steps],
                    "metrics_match": bool(pattern.search(steps[3].text)),
                    "answer": steps[1].text[:200],
                }
            )
    return out
