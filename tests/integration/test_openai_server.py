"""The model server's OpenAI-compatible HTTP endpoint, called with plain HTTP: answers, model
list, logprobs, and OpenAI-style errors with the right status codes."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_servers.testing import png_bytes
from tests.stack import Proc, Stack

MODEL = "random-baseline"
PROMPT = "Which plane is this slice?\nA. axial\nB. coronal\nC. sagittal"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, benchmark_root: Path) -> Iterator[Proc]:
    stack = Stack(tmp_path_factory.mktemp("openai"), benchmark_root)
    try:
        yield stack.start_model("openai", "random", ["--openai-port", "0"])
    finally:
        stack.close()


def http(server: Proc, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.ports['openai_port']}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def image_part(data: bytes, media: str = "image/png") -> dict[str, Any]:
    url = f"data:{media};base64,{base64.b64encode(data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def test_models_lists_the_served_model(server: Proc) -> None:
    status, body = http(server, "GET", "/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == [MODEL]


def test_chat_completion(server: Proc) -> None:
    content = [image_part(png_bytes()), {"type": "text", "text": PROMPT}]
    status, body = http(server, "POST", "/v1/chat/completions", chat(content, logprobs=True))
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and "Answer:" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"] == {"content": []}  # the baseline offers none
    assert body["usage"]["completion_tokens"] > 0 and body["system_fingerprint"] == "1"
    # The same item over plain string content without the image is a text-only request.
    status, text_only = http(server, "POST", "/v1/chat/completions", chat(PROMPT, max_tokens=2))
    assert status == 200 and text_only["choices"][0]["finish_reason"] == "length"
    assert text_only["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "not JSON"),
        ({"model": MODEL}, 400, "messages must be a non-empty list"),
        (chat([image_part(b"\x89PNG junk"), {"type": "text", "text": PROMPT}]), 400, "image 0 does not decode"),
        (chat([{"type": "image_url", "image_url": {"url": "https://example.org/x.png"}}]), 400, "only data URLs"),
        (chat([{"type": "audio", "audio": "x"}]), 400, "not a text or image_url part"),
        (chat(PROMPT, max_tokens=0), 400, "max_tokens must be a positive integer"),
        ({**chat(PROMPT), "model": "no-such-model"}, 404, "'no-such-model' does not exist"),
    ],
    ids=["not-json", "no-messages", "bad-image", "remote-url", "unknown-part", "bad-max-tokens", "unknown-model"],
)  # fmt: skip
def test_errors_are_openai_style(server: Proc, body: Any, status: int, message: str) -> None:
    got, answer = http(server, "POST", "/v1/chat/completions", body)
    assert got == status
    assert message in answer["error"]["message"]
    assert answer["error"]["type"] == (
        "not_found_error" if status == 404 else "invalid_request_error"
    )
    # ...and the server keeps serving.
    assert http(server, "POST", "/v1/chat/completions", chat(PROMPT))[0] == 200
