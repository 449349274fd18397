"""Imported by the workers' fork server only (its preload list), never by the parent.

The fork server restores in each child the signal handlers that stood after its preload. Ignoring Ctrl-C
here makes every worker start with it ignored, from its first instruction: a Ctrl-C sent to the terminal's
process group just as a case starts can no longer kill the worker before it has set that itself (the case
was recorded ``crashed: worker exited with code 1``, and a later ``--resume`` counted it done). The parent
decides what Ctrl-C does.
"""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
