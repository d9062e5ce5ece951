"""The two reference models of ``shared/reference/baseline.md`` (tiny: an MLP on 64 floats; cnn:
a small ResNet on 3x64x64, 308,650 parameters) and their bodies (raw little-endian float32, what
the handler decodes). Both are seeded, so every machine measures the same weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from torchbay.benchmarks.errors import BenchError

MODEL_NAMES = ("tiny", "cnn")
# Shape of ONE sample (no batch dimension), as the handler reshapes each request body.
SAMPLE_SHAPES: dict[str, tuple[int, ...]] = {"tiny": (64,), "cnn": (3, 64, 64)}


def _known(name: str) -> str:
    if name not in SAMPLE_SHAPES:
        raise BenchError(f"unknown reference model {name!r}; known: {', '.join(MODEL_NAMES)}")
    return name


def _conv_bn(in_ch: int, out_ch: int, size: int, stride: int) -> list[nn.Module]:
    conv = nn.Conv2d(in_ch, out_ch, size, stride=stride, padding=size // 2, bias=False)
    return [conv, nn.BatchNorm2d(out_ch)]


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with BN; identity or 1x1-conv+BN shortcut."""

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(in_ch, out_ch, 3, stride)
        self.conv2, self.bn2 = _conv_bn(out_ch, out_ch, 3, 1)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(*_conv_bn(in_ch, out_ch, 1, stride))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A stem (3x3 conv to ``stem`` channels, BN, ReLU), basic blocks of (channels, stride),
    global average pool, linear to 10 classes: the baseline's cnn by default."""

    def __init__(self, stem: int = 32, blocks: tuple[tuple[int, int], ...] = ()) -> None:
        super().__init__()
        blocks = blocks or ((32, 1), (64, 2), (128, 2))
        self.stem = nn.Sequential(*_conv_bn(3, stem, 3, 1), nn.ReLU())
        widths = [stem, *(c for c, _ in blocks)]
        self.blocks = nn.Sequential(*(BasicBlock(widths[i], *b) for i, b in enumerate(blocks)))
        self.fc = nn.Linear(widths[-1], 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def seeded(make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` built after seeding, in eval mode: the same weights on every machine."""
    torch.manual_seed(0)
    return make().eval()


def build(name: str) -> nn.Module:
    """A reference model by name (``tiny`` or ``cnn``), seeded and in eval mode."""
    if _known(name) == "tiny":
        return seeded(lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    return seeded(SmallResNet)


def save_scripted(model: nn.Module, path: str | Path) -> Path:
    """Script ``model`` with ``torch.jit.script`` and save it to ``path``; return the path."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(model).save(str(path))
    return Path(path)


def sample_tensor(name: str) -> torch.Tensor:
    """One deterministic sample for ``name`` (no batch dimension), float32."""
    gen = torch.Generator().manual_seed(1234)
    return torch.randn(SAMPLE_SHAPES[_known(name)], generator=gen, dtype=torch.float32)


def sample_body(name: str) -> bytes:
    """The request body for ``name``: one sample as raw little-endian float32."""
    return sample_tensor(name).numpy().astype("<f4").tobytes()
