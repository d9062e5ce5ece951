"""The pieces a SageMaker model directory goes through, one at a time: where an absolute
directory is taken from, the manifest and handler TorchServe makes up for it, the link it is
served through (never its files removed), the toolkit's handler file imported as TorchServe
imports it, and decode_input_request=false (the toolkit decodes bodies itself)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from torchbay.handlers.errors import HandlerLoadError
from torchbay.handlers.runtime.envelopes import decode_request
from torchbay.handlers.runtime.resolve import resolve_handler
from torchbay.server.config.settings import ServerConfig
from torchbay.server.errors import BadRequest
from torchbay.server.serving import store
from torchbay.server.serving.registry import ModelRegistry

HANDLER_SERVICE = """
from collections import OrderedDict  # an imported class is not a candidate


def helper():
    return "a module function that is not the one named"


class HandlerService:
    def initialize(self, context):
        self.ready = True

    def handle(self, data, context):
        return ["served by the class"]
"""


def test_an_absolute_directory_is_taken_only_as_itself_or_its_one_folder(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "code").mkdir(parents=True)
    (model / "model.pth").write_bytes(b"x")
    assert store.startup_directory(str(model)) == model
    assert store.startup_directory(f"file://{model}") == model
    wrapped = tmp_path / "wrapped"
    (wrapped / "root" / "code").mkdir(parents=True)  # a tarball's root folder (TorchServe)
    assert store.startup_directory(str(wrapped)) == wrapped / "root"
    assert store.startup_directory("model") is None  # relative: the model store's rules
    assert store.startup_directory(str(model / "model.pth")) is None
    assert store.is_model_directory(model)
    (model / "MAR-INF").mkdir()
    (model / "MAR-INF" / "MANIFEST.json").write_text("{}")
    assert not store.is_model_directory(model)  # an archive directory: extracted as before


def test_removing_a_model_directorys_link_keeps_its_files(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.pth").write_bytes(b"weights")
    link = tmp_path / "work" / "model-1.0-abc"
    link.parent.mkdir()
    link.symlink_to(model, target_is_directory=True)
    store.remove(link)
    assert not link.exists() and not link.is_symlink()
    assert (model / "model.pth").read_bytes() == b"weights"


def _registry(tmp_path: Path, **settings: Any) -> ModelRegistry:
    config = ServerConfig.model_validate({"model_store": tmp_path / "store", **settings})
    (tmp_path / "store").mkdir(exist_ok=True)

    def place(*args: Any) -> Any:
        raise AssertionError("no worker is started in these tests")

    return ModelRegistry(config, place=place, server_version="t", workdir=tmp_path / "w")


def test_a_model_directory_registers_as_torchserve_names_it(tmp_path: Path) -> None:
    model = tmp_path / "ml" / "model"
    (model / "code").mkdir(parents=True)
    (model / "model.pth").write_bytes(b"weights")
    handler = "/opt/toolkit/handler_service.py:handle"
    registry = _registry(tmp_path, default_service_handler=handler)

    async def go() -> None:
        mv = await registry.register(f"{model}", name="model", initial_workers=0)
        assert (mv.name, mv.version, mv.config.handler) == ("model", "1.0", handler)
        assert mv.model_dir.is_symlink() and mv.model_dir.resolve() == model.resolve()
        assert registry.startup_models == {"model/1.0"}
        await registry.unregister("model")
        assert not mv.model_dir.is_symlink()
        assert (model / "model.pth").read_bytes() == b"weights"  # the user's files stay
        await registry.stop()

    asyncio.run(go())


def test_api_clients_name_neither_outside_directories_nor_outside_handlers(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "store" / "inside").mkdir(parents=True)
    registry = _registry(tmp_path)

    async def go() -> None:
        with pytest.raises(BadRequest, match="inside the model store"):
            await registry.register(str(outside), startup=False, initial_workers=0)
        with pytest.raises(BadRequest, match="inside the archive"):
            await registry.register(
                "inside",
                startup=False,
                initial_workers=0,
                overrides={"handler": f"{outside}/evil.py:handle"},
            )
        assert registry.models == {}
        await registry.stop()

    asyncio.run(go())


def test_an_absolute_handler_file_is_imported_by_name_from_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "toolkit_sm_test"
    folder.mkdir()
    (folder / "sm_handler_service.py").write_text(HANDLER_SERVICE)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    spec = f"{folder}/sm_handler_service.py:handle"
    # A manifest's handler never reaches outside the model directory ...
    with pytest.raises(HandlerLoadError, match="inside the archive"):
        resolve_handler(spec, model_dir)
    # ... the server's default_service_handler does, and "handle" being a method of the
    # module's handler class (not a module function), the class serves (TorchServe's rule).
    resolved = resolve_handler(spec, model_dir, outside_ok=True)
    assert type(resolved.instance).__name__ == "HandlerService"
    assert resolved.entry([{}], None) == ["served by the class"]
    with pytest.raises(HandlerLoadError, match="cannot be imported"):
        resolve_handler(f"{folder}/no_such_module.py:handle", model_dir, outside_ok=True)


def test_decode_input_request_false_hands_json_and_text_as_bytes() -> None:
    assert decode_request(b"[[1, 2]]", "application/json", "")["body"] == [[1, 2]]
    assert decode_request(b"[[1, 2]]", "application/json", "", False)["body"] == b"[[1, 2]]"
    assert decode_request(b"a,b", "text/csv", "", False)["body"] == b"a,b"
    # Form fields are TorchServe's frontend's parameters: parsed either way.
    assert decode_request(b"x=1", "application/x-www-form-urlencoded", "", False) == {"x": b"1"}
