"""Imported by the workers' fork server only (its preload list), never by the parent.

The fork server restores in each child the signal handlers that stood after its preload. Ignoring
Ctrl-C here makes every worker start with it ignored, from its first instruction: a Ctrl-C sent to
the terminal's process group just as a case starts can no longer kill the worker before it has set
that itself (the case was recorded ``crashed: worker exited with code 1``, and a later ``--resume``
counted it done). The parent decides what Ctrl-C does, and what SIGTERM and SIGHUP do (sent to the
whole group by a CI runner or a service manager): it kills the case in hand itself, and the server
exits when the parent does.
"""

import signal

__all__: list[str] = []

for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, signal.SIG_IGN)
