"""Linters and a security scan over deploy/: hadolint on the Dockerfiles, yamllint on every YAML,
checkov on the Dockerfiles and the rendered kustomize overlays, sh -n (and shellcheck where
installed) on the entrypoint. A missing tool skips with the way to install it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import DEPLOY, ENTRYPOINT, ROOT, require_tool, yaml_files

DOCKERFILES = sorted(
    p for p in (DEPLOY / "docker").glob("Dockerfile.*") if p.suffix != ".dockerignore"
)
INSTALL = "pip install -r deploy/requirements-lint.txt (scripts/setup.sh does)"


def run(cmd: list[str], cwd: Path = ROOT, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_SKIP_DOWNLOAD": "true"}
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def test_dockerfiles_exist() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.cuda"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile: Path) -> None:
    hadolint = require_tool("hadolint", INSTALL)
    out = run([hadolint, "--failure-threshold", "info", str(dockerfile)])
    assert out.returncode == 0, out.stdout + out.stderr
    # An ignore must say why, on the same line or the comment line above it.
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            reason = re.sub(r".*hadolint ignore=\S+", "", line).strip(" #")
            above = lines[i - 1].strip() if i else ""
            assert reason or (above.startswith("#") and "hadolint" not in above), line


def test_image_conventions() -> None:
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        final = text[text.rindex("\nFROM ") :]  # the runtime stage
        assert "USER 10001" in final and "HEALTHCHECK" in final
        assert '"/usr/bin/tini", "--"' in final and 'CMD ["serve"]' in final
        assert "gcc" not in final and "build-essential" not in final
        assert "/v2/health/live" in final
        assert re.search(r"ARG TORCH_VERSION=2\.13\.0", text)
        assert "ARG TORCH_INDEX_URL=" in text


def test_yamllint() -> None:
    yamllint = require_tool("yamllint", INSTALL)
    files = yaml_files()
    assert len(files) >= 20
    out = run([yamllint, "--strict", "-c", str(ROOT / ".yamllint"), *map(str, files)])
    assert out.returncode == 0, out.stdout + out.stderr


def test_checkov() -> None:
    checkov = require_tool("checkov", INSTALL, ROOT / ".venv-checkov" / "bin")
    out = run([checkov, "--config-file", ".checkov.yaml", "-d", ".", "-o", "cli"], cwd=DEPLOY)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    # Both frameworks ran and found something to check.
    assert re.search(r"dockerfile scan results:\s+Passed checks: [1-9]", out.stdout), out.stdout
    assert re.search(r"kustomize scan results:\s+Passed checks: [1-9]", out.stdout), out.stdout


def test_every_checkov_skip_is_justified() -> None:
    text = (DEPLOY / ".checkov.yaml").read_text()
    skips = yaml.safe_load(text)["skip-check"]
    lines = text.splitlines()
    for check in skips:
        (index,) = [i for i, line in enumerate(lines) if line.strip() == f"- {check}"]
        assert lines[index - 1].strip().startswith("#"), f"{check} has no reason above it"


def test_entrypoint_is_posix_sh() -> None:
    assert ENTRYPOINT.read_text().startswith("#!/bin/sh\n")
    assert os.access(ENTRYPOINT, os.X_OK)
    out = run(["sh", "-n", str(ENTRYPOINT)])
    assert out.returncode == 0, out.stderr
    shellcheck = require_tool("shellcheck", "apt-get install shellcheck")
    out = run([shellcheck, "-s", "sh", str(ENTRYPOINT)])
    assert out.returncode == 0, out.stdout
