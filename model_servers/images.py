"""Checking and decoding the encoded images of a request, with errors that name the image."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from rpc.errors import InvalidArgument

if TYPE_CHECKING:
    from PIL import Image


def decode_image(data: bytes, index: int) -> Image.Image:
    """Decode one encoded image fully; InvalidArgument naming ``index`` (0-based) if it cannot."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise InvalidArgument(f"image {index} is empty")
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InvalidArgument(f"image {index} does not decode as an image") from exc
    except Image.DecompressionBombError as exc:
        raise InvalidArgument(f"image {index} is too large to decode") from exc
    return image


def check_media_type(media_type: str, index: int) -> None:
    """An empty media type is allowed (the bytes say what they are); anything else is image/*."""
    if media_type and not media_type.lower().startswith("image/"):
        raise InvalidArgument(f"image {index} has media type {media_type!r}, not image/*")
