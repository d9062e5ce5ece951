"""What ``torchbay archive`` was asked for (``ArchiveOptions``) and the staged files (``Stage``),
shared by ``package.py`` (which stages and writes the archive) and ``build.py`` (which converts
the model and checks parity): package imports build (lazily, for torch), build imports neither
package nor anything that imports it. Torch-free.
"""

from __future__ import annotations

import filecmp
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from torchbay.archiver.errors import ArchiveArgumentError
from torchbay.archiver.manifest import Precision, check_folder_name
from torchbay.archiver.write import ArchiveFormat

Convert = Literal["none", "torchscript-trace", "torchscript-script", "export", "aoti"]


class ArchiveOptions(BaseModel):
    """Everything ``torchbay archive`` takes; paths are resolved against the current directory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_name: str
    version: str
    handler: str
    serialized_file: Path | None = None
    model_file: Path | None = None
    extra_files: tuple[str, ...] = ()
    requirements_file: Path | None = None
    config_file: Path | None = None
    export_path: Path = Path(".")
    archive_format: ArchiveFormat = "default"
    force: bool = False
    runtime: Literal["python", "python3"] = "python"
    convert: Convert = "none"
    device: Literal["cpu", "cuda"] = "cpu"  # --convert aoti: the device compiled for
    precision: Precision = "fp32"
    optimize: bool = False
    example_input: Path | None = None
    # A limit the parity check compares with: NaN passed every model (and wrote NaN, no JSON,
    # into the manifest); "accept any drift" is --allow-drift.
    tolerance: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    min_top1_agreement: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    allow_drift: bool = False

    @field_validator("model_name", "version")
    @classmethod
    def _folder_name(cls, value: str, info: ValidationInfo) -> str:
        # the manifest's own rule: an archive always makes a manifest that loads
        return check_folder_name(
            "model_name" if info.field_name == "model_name" else "model_version", value
        )

    @field_validator("extra_files", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        # torch-model-archiver takes one comma-separated string.
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        return value


@dataclass
class Stage:
    """Files to pack: archive name -> source path (None = already written in the staging dir)."""

    root: Path
    files: dict[str, Path] = field(default_factory=dict)

    def add(self, name: str, source: Path) -> None:
        if name in self.files and not filecmp.cmp(self.files[name], source, shallow=False):
            raise ArchiveArgumentError(
                f"two different files would be packed as {name!r} ({self.files[name]} and {source})"
            )
        if name.split("/")[0] == "MAR-INF":
            raise ArchiveArgumentError(f"{source}: MAR-INF/ is reserved for the manifest")
        self.files[name] = source

    def written(self, name: str) -> Path:
        """A path in the staging dir for a file the archiver writes itself."""
        path = self.root / "generated" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        self.files[name] = path
        return path
