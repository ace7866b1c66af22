"""The scripted exchanges' images and sounds, made by code (the image entrypoint's own generators,
standard library only) so the script
carries no binary blobs and every byte is reproducible: solid-colour PNGs and pure-tone WAVs.

Solid colours and pure tones also keep the model's inputs the same whichever decoder and resize
backend reads them (PIL on the training host, torchvision inside the image): every pixel of a
resized solid image keeps its colour.
"""

from __future__ import annotations

import base64

from gemma4_images.spec.image_code import gemma4_serve

IMAGE_SIZE = 32  # pixels a side; vLLM and the processor give it 256 soft tokens
SAMPLE_RATE = 16000  # the feature extractor's rate, so nothing is resampled
TONE_SECONDS = 0.5  # 13 audio soft tokens


def png(rgb: tuple[int, int, int], size: int = IMAGE_SIZE) -> bytes:
    """A size x size RGB PNG of one colour (the image's own generator, gemma4-serve's)."""
    return gemma4_serve.test_png(size, rgb)


def wav(hz: float, seconds: float = TONE_SECONDS, rate: int = SAMPLE_RATE) -> bytes:
    """A mono 16-bit WAV of a sine tone at half of full scale (gemma4-serve's generator)."""
    return gemma4_serve.test_wav(rate, seconds, hz)


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
