"""The scripted exchanges' images and sounds, made by code (standard library only) so the script
carries no binary blobs and every byte is reproducible: solid-colour PNGs and pure-tone WAVs.

Solid colours and pure tones also keep the model's inputs the same whichever decoder and resize
backend reads them (PIL on the training host, torchvision inside the image): every pixel of a
resized solid image keeps its colour.
"""
from __future__ import annotations

import base64
import io
import math
import struct
import wave
import zlib

IMAGE_SIZE = 32            # pixels a side; vLLM and the processor give it 256 soft tokens
SAMPLE_RATE = 16000        # the feature extractor's rate, so nothing is resampled
TONE_SECONDS = 0.5         # 13 audio soft tokens


def png(rgb: tuple[int, int, int], size: int = IMAGE_SIZE) -> bytes:
    """A size x size RGB PNG of one colour."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    row = b"\x00" + bytes(rgb) * size          # filter type 0, then the pixels
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)   # 8-bit truecolour
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(row * size, 9)) + chunk(b"IEND", b""))


def wav(hz: float, seconds: float = TONE_SECONDS, rate: int = SAMPLE_RATE) -> bytes:
    """A mono 16-bit WAV of a sine tone at half of full scale."""
    frames = b"".join(struct.pack("<h", round(16383 * math.sin(2 * math.pi * hz * n / rate)))
                      for n in range(round(seconds * rate)))
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return out.getvalue()


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
