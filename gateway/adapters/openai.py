"""Adapter for OpenAI-compatible Chat Completions servers (vLLM, TGI, Vigil's own) over HTTP.

Images go as data URLs in ``image_url`` content parts, before the prompt's text part. The served
model comes from ``GET /v1/models`` (the endpoint's ``model_name``, or the only model listed); its
name in every reply is the answer's ``model`` field and its version the ``system_fingerprint``
when the server sends one. The config digest is a SHA-256 over the model's ``/v1/models`` entry
(for vLLM: its root path and context length), so a different model behind the same name shows.

Errors: HTTP 429 and 503 and refused connections are retryable; a deadline is a timeout; every
other failure is a plain transport error with the server's message.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from typing import Any

import aiohttp

from gateway.adapters.base import AdapterError, AdapterTarget, ModelIdentity, ModelReply

MAX_TOKENS = 64
"""New-token limit sent with every request (as ``max_tokens``, which every server reads)."""

_RETRYABLE_HTTP = {429, 503}


def base_url(address: str) -> str:
    """``host:port`` or a URL, as the root that ``/v1/...`` paths hang from."""
    url = address if "://" in address else f"http://{address}"
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def entry_digest(entry: dict[str, Any]) -> str:
    """The first 16 hex digits of a SHA-256 over a model entry's canonical JSON."""
    canonical = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(canonical).hexdigest()[:16]


def _message(status: int, body: str) -> str:
    try:
        detail = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        detail = body.strip()[:200] or "no details"
    return f"HTTP {status}: {detail}"


def chat_body(model: str, images: list[tuple[bytes, str]], prompt: str) -> bytes:
    """The Chat Completions request as JSON bytes: one user turn, the images as data URLs first.

    The base64 text needs no JSON escaping, so it is spliced in rather than passed through
    ``json.dumps`` (which would scan a 64 KB image's 87 KB of text once more per request).
    """
    parts = [
        b'{"type":"image_url","image_url":{"url":'
        + json.dumps(f"data:{media or 'image/png'};base64,").encode()[:-1]
        + base64.b64encode(data)
        + b'"}}'
        for data, media in images
    ]
    parts.append(json.dumps({"type": "text", "text": prompt}).encode())
    head = json.dumps({"model": model, "max_tokens": MAX_TOKENS, "temperature": 0})
    return (
        head[:-1].encode() + b',"messages":[{"role":"user","content":[' + b",".join(parts) + b"]}]}"
    )


class OpenAIAdapter:
    """Calls one model's Chat Completions over one shared aiohttp session."""

    protocol = "openai"

    def __init__(self, target: AdapterTarget) -> None:
        self.address = target.address
        self._target = target
        self._base = base_url(target.address)
        self._session: aiohttp.ClientSession | None = None
        self._name = target.model_name
        self._digest = ""

    @property
    def session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the event loop (an adapter built only to check the protocol
        # opens nothing).
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
            )
        return self._session

    async def _call(
        self, method: str, path: str, timeout_s: float, body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str]:  # fmt: skip
        if body is not None:
            headers = {**(headers or {}), "Content-Type": "application/json"}
        try:
            async with self.session.request(
                method,
                self._base + path,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                text = await response.text()
                return response.status, text
        except TimeoutError:
            raise AdapterError(f"no answer within {timeout_s:g}s", timeout=True) from None
        except aiohttp.ClientConnectionError as exc:
            raise AdapterError(f"connection failed: {exc}", retryable=True) from None
        except aiohttp.ClientError as exc:
            raise AdapterError(f"HTTP client error: {exc}") from None

    async def describe(self, timeout_s: float) -> ModelIdentity:
        status, text = await self._call("GET", "/v1/models", timeout_s)
        if status in _RETRYABLE_HTTP:
            return ModelIdentity(self._name, "", ready=False)
        if status != 200:
            raise AdapterError(_message(status, text))
        try:
            entries = [e for e in json.loads(text)["data"] if isinstance(e, dict)]
        except (ValueError, KeyError, TypeError):
            raise AdapterError("GET /v1/models did not answer a model list") from None
        served = {str(e.get("id", "")): e for e in entries}
        name = self._target.model_name
        if not name:
            if len(served) != 1:
                listed = ", ".join(sorted(served)) or "none"
                raise AdapterError(f"set the endpoint's model_name; the server lists: {listed}")
            name = next(iter(served))
        if name not in served:
            listed = ", ".join(sorted(served)) or "none"
            raise AdapterError(f"model {name!r} is not served; the server lists: {listed}")
        entry = served[name]
        self._name, self._digest = name, entry_digest(entry)
        version = str(entry.get("version") or self._target.model_version or "")
        return ModelIdentity(name, version, ready=True, config_digest=self._digest)

    async def generate(
        self,
        images: list[tuple[bytes, str]],
        prompt: str,
        request_id: str,
        timeout_s: float,
    ) -> ModelReply:
        if not self._digest:  # not described yet: find the model and its entry first
            identity = await self.describe(timeout_s)
            if not identity.ready:
                raise AdapterError("HTTP 503: model is not ready", retryable=True)
        body = chat_body(self._name, images, prompt)
        status, text = await self._call(
            "POST", "/v1/chat/completions", timeout_s, body, {"X-Request-Id": request_id}
        )
        if status != 200:
            raise AdapterError(_message(status, text), retryable=status in _RETRYABLE_HTTP)
        try:
            answer = json.loads(text)
            message = answer["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise AdapterError("the answer is not a chat completion") from None
        return ModelReply(
            str(message.get("content") or ""),
            str(answer.get("model") or self._name),
            str(answer.get("system_fingerprint") or ""),
            self._digest,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)  # let the connector release its sockets
