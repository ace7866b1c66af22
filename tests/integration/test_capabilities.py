"""The build's capability check (`gemma4-serve --self-check`, a step of every image build) refuses a
base that cannot serve what the launch enables, one line per missing piece, naming the target and
the targets.yaml switch. Each piece is taken out of the real CPU image in a throwaway container (a
stand-in for a base without it) and the check run there; a real build on a base with the wrong
CUDA runtime fails and tags nothing."""

import pytest

from gemma4_images.build import owned
from gemma4_images.spec import matrix
from testkit import tiny_model

pytestmark = pytest.mark.integration
SITE = "/opt/venv/lib/python3.11/site-packages"

# piece -> (shell that removes it, the refusal expected, as the start of its one line). Each was
# also run alone once (one line each); together they cost one check instead of five.
PIECES = {
    "audio decoders": (
        f"rm -r {SITE}/soundfile.py {SITE}/av",
        "xeon6: the base cannot decode and resample audio with vLLM's loader",
    ),
    "image decoder": (f"rm {SITE}/PIL/PngImagePlugin.py", "xeon6: the base cannot decode images with vLLM's loader"),
    "tool parser": (
        f"rm {SITE}/vllm/tool_parsers/gemma4_engine_tool_parser.py",
        "xeon6: vLLM in the base has no tool-call parser 'gemma4'",
    ),
    "reasoning parser": (
        f"rm {SITE}/vllm/reasoning/gemma4_engine_reasoning_parser.py",
        "xeon6: vLLM in the base has no reasoning parser 'gemma4'",
    ),
    "transformers Gemma 4": (
        f"rm -r {SITE}/transformers/models/gemma4",
        "xeon6: transformers in the base lacks the Gemma 4 classes",
    ),
}
PREFIX = "gemma4-serve: self-check: "
CPU = matrix.load_default("xeon6")  # cpu_image's release


def self_check(client, image, shell: str, recipe: str | None = None) -> tuple[int, list[str]]:
    """Run shell, then the build's self-check, in a throwaway container of image; with recipe, the
    check reads that target's committed recipe (what its own image bakes) instead of the image's."""
    kw = {}
    if recipe:
        path = matrix.ROOT / CPU.recipe_file(recipe)  # at the CPU image's release
        assert path.is_file(), path  # else docker would make an empty folder there to bind
        kw = {
            "environment": {"GEMMA4_RECIPE": "/tmp/recipe.json"},
            "volumes": {str(path): {"bind": "/tmp/recipe.json", "mode": "ro"}},
        }
    container = client.containers.run(
        image,
        ["-c", f"{shell} && exec gemma4-serve --self-check"],
        entrypoint=["sh"],
        user="0",
        detach=True,
        network_mode="host",
        labels=owned.labels(),
        **kw,
    )
    try:
        code = container.wait(timeout=600)["StatusCode"]
        lines = container.logs().decode().splitlines()
    finally:
        container.remove(force=True)
    return code, [line for line in lines if line.startswith(PREFIX)]


def test_each_missing_piece_is_refused_in_its_own_line(client, cpu_image):
    code, problems = self_check(client, cpu_image, " && ".join(shell for shell, _ in PIECES.values()))
    assert code == 1
    refused = {
        piece: [p for p in problems if p.startswith(PREFIX + expected)] for piece, (_, expected) in PIECES.items()
    }
    assert all(len(lines) == 1 for lines in refused.values()), problems
    assert len(problems) == len(PIECES), problems  # nothing else is refused
    assert "xeon6's serve.unsupported_modalities" in refused["audio decoders"][0]
    assert "text_only" in refused["image decoder"][0]
    assert "unsupported_features" in refused["tool parser"][0]


def test_audio_without_its_resampler_is_refused(client, cpu_image):
    # Gemma 4 resamples audio to 16 kHz with torchaudio (vllm gemma4_mm get_data_parser).
    code, problems = self_check(client, cpu_image, f"rm -r {SITE}/torchaudio")
    assert code == 1 and len(problems) == 1
    assert problems[0].startswith(PREFIX + PIECES["audio decoders"][1]) and "torchaudio" in problems[0]


def test_vllm_without_its_gemma4_class_is_refused(client, cpu_image):
    # Alone: without transformers' Gemma 4 the class cannot import either, and only that is named.
    code, problems = self_check(client, cpu_image, f"rm {SITE}/vllm/model_executor/models/gemma4_mm.py")
    assert code == 1 and len(problems) == 1, problems
    assert problems[0].startswith(PREFIX + "xeon6: vLLM in the base cannot load the model class for Gemma4For")


def test_a_cuda_target_names_the_tag_that_carries_its_runtime(client, cpu_image):
    # h100's recipe on the CPU image: the base's torch reports no CUDA at all, and that is the only
    # thing refused (so everything else the check probes is there: the control for the tests above).
    code, problems = self_check(client, cpu_image, "true", recipe="h100")
    assert code == 1
    assert problems == [
        "gemma4-serve: self-check: h100: the base's torch is built for no CUDA, h100 "
        f"expects CUDA 12.9: build on {CPU.targets['h100'].base.image}"
    ]


def test_h100_on_the_real_cuda_13_stand_in_stops_at_the_cuda_check_alone(m, cuda_base, refused_build):
    # How h100/h200 are checked here, PyPI having no CUDA 12.9 torch: their image on the CUDA 13.0
    # stand-in (the same vLLM code as their base) runs every step before the self-check (audio
    # extras, fixes), and the self-check's only problem is the CUDA runtime: transformers, the
    # model class, media loaders, parsers and every launch pass on the real code. (Relabelling
    # torch.version.cuda instead is no stand-in: torchvision and torchaudio then refuse the torch.)
    failed = refused_build(
        "h100", "gemma4-e2b-test/h100:wrong-cuda", base_override=cuda_base, tokenizer_source=str(tiny_model.ensure())
    )
    assert "--self-check" in failed.step
    said = [line.strip(" |") for line in failed.tail if "self-check:" in line]
    assert said == [
        "gemma4-serve: self-check: h100: the base's torch is built for CUDA 13.0, h100 expects CUDA 12.9: build on "
        f"{m.targets['h100'].base.image} ({m.targets['b200'].base.image} is the CUDA 13.0 build)"
    ], failed.tail
