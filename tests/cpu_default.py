"""xeon6 at the CPU default (targets.yaml's defaults.cpu): the names its images and reports carry,
so that moving the default (`build.py promote`) moves the tests with it."""

from gemma4_images.publish import reports
from gemma4_images.spec import matrix

TARGET = "xeon6"
_AT_DEFAULT = matrix.load_default(TARGET)
RELEASE = _AT_DEFAULT.report_release  # None at the first release: its reports keep plain names
NAME = _AT_DEFAULT.version_name(TARGET)  # xeon6-v<the CPU default>
SMOKE_OPTION = f" --vllm {RELEASE}" if RELEASE else ""  # what `build.py smoke` is told for that release


def key(platform: str | None = None) -> str:
    """The name of its reports for platform (None: the default platform)."""
    return reports.key(TARGET, platform, RELEASE)


KEY = key()
