"""The two reference models of ``shared/reference/baseline.md`` (tiny: an MLP on 64 floats; cnn:
a small ResNet on 3x64x64, 308,650 parameters) and their bodies (raw little-endian float32, what
the handler decodes). Both are seeded, so every machine measures the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from torchbay.benchmarks.errors import BenchError

MODEL_NAMES = ("tiny", "cnn")
# Shape of ONE sample (no batch dimension), as the handler reshapes each request body.
SAMPLE_SHAPES: dict[str, tuple[int, ...]] = {"tiny": (64,), "cnn": (3, 64, 64)}
NUM_CLASSES = 10


def _check_name(name: str) -> None:
    if name not in SAMPLE_SHAPES:
        choices = ", ".join(MODEL_NAMES)
        raise BenchError(f"unknown reference model {name!r}; choose one of {choices}")


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with BN; identity or 1x1-conv+BN shortcut."""

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            conv = nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)
            self.shortcut = nn.Sequential(conv, nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """A stem (3x3 conv to ``stem`` channels, BN, ReLU), basic blocks of (channels, stride),
    global average pool, linear: the baseline's cnn by default."""

    def __init__(self, stem: int = 32, blocks: tuple[tuple[int, int], ...] = ()) -> None:
        super().__init__()
        blocks = blocks or ((32, 1), (64, 2), (128, 2))
        conv = nn.Conv2d(3, stem, 3, stride=1, padding=1, bias=False)
        self.stem = nn.Sequential(conv, nn.BatchNorm2d(stem), nn.ReLU())
        widths = [stem, *(c for c, _ in blocks)]
        self.blocks = nn.Sequential(
            *(BasicBlock(widths[i], c, s) for i, (c, s) in enumerate(blocks))
        )
        self.fc = nn.Linear(widths[-1], NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def seeded(make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` built after seeding, in eval mode: the same weights on every machine."""
    torch.manual_seed(0)
    return make().eval()


def build(name: str) -> nn.Module:
    """A reference model by name (``tiny`` or ``cnn``), seeded and in eval mode."""
    _check_name(name)
    if name == "tiny":
        return seeded(lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    return seeded(SmallResNet)


def save_scripted(model: nn.Module, path: str | Path) -> Path:
    """Script ``model`` with ``torch.jit.script`` and save it to ``path``; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(model).save(str(path))
    return path


def sample_tensor(name: str) -> torch.Tensor:
    """One deterministic sample for ``name`` (no batch dimension), float32."""
    _check_name(name)
    gen = torch.Generator().manual_seed(1234)
    return torch.randn(SAMPLE_SHAPES[name], generator=gen, dtype=torch.float32)


def sample_body(name: str) -> bytes:
    """The request body for ``name``: one sample as raw little-endian float32."""
    return sample_tensor(name).numpy().astype("<f4").tobytes()
