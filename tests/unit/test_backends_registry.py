"""The backend registry, the request checks every backend relies on, and hf's path errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from model_servers.backends import (
    BACKENDS,
    BackendLoadError,
    BackendSettings,
    GenerationInput,
    UnknownBackend,
    create_backend,
)
from model_servers.backends.hf import model_name_of, model_version
from model_servers.runtime import validate
from model_servers.testing import png_bytes
from rpc.errors import InvalidArgument


def test_registry_names() -> None:
    assert {"random", "hf"} <= set(BACKENDS)


def test_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(UnknownBackend, match=r"unknown backend 'nope'; known backends: hf, random"):
        create_backend("nope", BackendSettings())


def test_importing_the_registry_does_not_import_torch() -> None:
    import subprocess

    code = "import model_servers.backends, model_servers.main, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_hf_needs_a_model_path() -> None:
    with pytest.raises(BackendLoadError, match="model path"):
        create_backend("hf", BackendSettings())


def test_hf_missing_path_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    backend = create_backend("hf", BackendSettings(model_path=missing))
    with pytest.raises(BackendLoadError, match=str(missing)):
        backend.load()


def test_hf_folder_without_config_is_not_a_model(tmp_path: Path) -> None:
    backend = create_backend("hf", BackendSettings(model_path=tmp_path))
    with pytest.raises(BackendLoadError, match="no config.json"):
        backend.load()


def test_model_version_hashes_config_and_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "README.md").write_text("not hashed")
    first = model_version(tmp_path)
    assert len(first) == 12 and int(first, 16) >= 0
    (tmp_path / "README.md").write_text("changed")
    assert model_version(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    assert model_version(tmp_path) != first


def test_model_name_override_then_saved_name_then_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"_name_or_path": "org/vlm-7b"}')
    assert model_name_of(tmp_path, "mine") == "mine"
    assert model_name_of(tmp_path, None) == "org/vlm-7b"
    (tmp_path / "config.json").write_text("{}")
    assert model_name_of(tmp_path, None) == tmp_path.name


def request(**fields: object) -> GenerationInput:
    base: dict[str, object] = {
        "images": [png_bytes()],
        "media_types": ["image/png"],
        "prompt": "Which plane?",
        "max_new_tokens": 8,
    }
    base.update(fields)
    return GenerationInput(**base)  # type: ignore[arg-type]


def test_validate_accepts_a_good_request() -> None:
    validate(request(), max_images=8)
    validate(request(images=[], media_types=[]), max_images=8)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": "  \n"}, "prompt is empty"),
        (
            {"images": [png_bytes(), b"not an image"], "media_types": ["", ""]},
            "image 1 does not decode",
        ),
        ({"images": [b""], "media_types": [""]}, "image 0 is empty"),
        ({"images": [png_bytes()[:40]], "media_types": ["image/png"]}, "image 0 does not decode"),
        ({"media_types": ["text/plain"]}, "image 0 has media type 'text/plain'"),
        ({"images": [png_bytes()] * 3, "media_types": ["image/png"] * 3}, "at most 2"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_validate_rejects_with_a_message(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        validate(request(**fields), max_images=2)
