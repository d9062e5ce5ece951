"""Train scikit-learn's MLP on iris, convert it to torch, archive it (batched, TorchScript).

    python examples/tabular/build.py [--out examples/tabular/out]

Writes OUT/model_store/iris.mar and OUT/test_rows.json (held-out rows with scikit-learn's own
predictions, for comparison). The archive is checked by the archiver's parity check (the
TorchScript model against the eager torch model) and here against scikit-learn itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torchbay.handlers.testing import example_out, import_by_path, package_example_model

HERE = Path(__file__).resolve().parent


def model_module():
    """This example's model.py (by path: every example has one, see ``import_by_path``)."""
    return import_by_path(HERE / "model.py", f"_torchbay_example_{HERE.name}_model")


MODEL_CONFIG = """\
# Frontend settings TorchServe reads from model-config.yaml: up to 8 rows per handler call,
# waiting at most 20 ms for a batch to fill.
batchSize: 8
maxBatchDelay: 20
"""


@dataclass
class Built:
    store: Path
    mar: Path
    x_test: np.ndarray
    y_test: np.ndarray
    sklearn_proba: np.ndarray
    labels: list[str]


def train_sklearn(seed: int = 0):
    from sklearn.datasets import load_iris
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    iris = load_iris()
    x_train, x_test, y_train, y_test = train_test_split(
        iris.data, iris.target, test_size=0.3, random_state=seed, stratify=iris.target
    )
    scaler = StandardScaler().fit(x_train)
    mlp = MLPClassifier(hidden_layer_sizes=(16,), max_iter=2000, random_state=seed)
    mlp.fit(scaler.transform(x_train), y_train)
    return iris, scaler, mlp, x_test, y_test


def to_torch(scaler, mlp):
    """The torch IrisMlp with scikit-learn's weights (coefs_ are [in, out]: transpose)."""
    import torch

    IrisMlp = model_module().IrisMlp

    model = IrisMlp().eval()
    with torch.no_grad():
        model.mean.copy_(torch.from_numpy(scaler.mean_))
        model.scale.copy_(torch.from_numpy(scaler.scale_))
        model.hidden.weight.copy_(torch.from_numpy(mlp.coefs_[0].T))
        model.hidden.bias.copy_(torch.from_numpy(mlp.intercepts_[0]))
        model.out.weight.copy_(torch.from_numpy(mlp.coefs_[1].T))
        model.out.bias.copy_(torch.from_numpy(mlp.intercepts_[1]))
    return model


def build(out: Path) -> Built:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    iris, scaler, mlp, x_test, y_test = train_sklearn()
    model = to_torch(scaler, mlp)
    torch.save(model.state_dict(), out / "iris.pt")
    torch.save(torch.tensor(x_test[:8], dtype=torch.float32), out / "example_input.pt")
    labels = [str(n) for n in iris.target_names]
    (out / "index_to_name.json").write_text(json.dumps(dict(enumerate(labels))))
    (out / "model-config.yaml").write_text(MODEL_CONFIG)
    proba = mlp.predict_proba(scaler.transform(x_test))
    rows = {"rows": x_test.tolist(), "sklearn_proba": proba.tolist(), "labels": labels}
    (out / "test_rows.json").write_text(json.dumps(rows))
    store = out / "model_store"
    mar = package_example_model(
        HERE,
        out,
        "iris",
        str(HERE / "tabular_handler.py"),
        extra_files=(str(out / "index_to_name.json"),),
        convert="torchscript-trace",
        example_input=out / "example_input.pt",
    )
    return Built(store, Path(mar), x_test, y_test, proba, labels)


if __name__ == "__main__":
    built = build(example_out(__doc__, HERE / "out"))
    agree = (built.sklearn_proba.argmax(1) == built.y_test).mean()
    print(f"scikit-learn held-out accuracy {agree:.1%}; wrote {built.mar}")
