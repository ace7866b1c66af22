"""Child processes that take stop signals as one started from a terminal would. A test run started
under `nohup` or in the background passes SIGHUP or SIGINT down ignored, and `owned.stopping()`
rightly keeps a signal its process was started ignoring ignored; the tests of stopping want the
default, whatever started pytest."""

import signal

from gemma4_images.build.owned import STOP_SIGNALS


def default_stop_signals() -> None:
    """Popen's preexec_fn: the stop signals back to their default action in the child."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_DFL)
