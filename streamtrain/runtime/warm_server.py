"""Imported first, and only, by the fork server of warm.py, before anything else it
preloads: the server is the parent of every child of a supervisor, so it keeps out of the way of
signals meant for the supervisor.

- Its own session: a SIGTERM or SIGHUP to the supervisor's process group (`kill %1`, a closed
  terminal, `timeout`) is the supervisor's to handle, stopping its children in order; the
  server dying of it would end them all at once (they get SIGTERM when it ends). It still
  ends when the supervisor does (the "alive" pipe closes).
- SIGTERM and SIGHUP ignored, for the same reason; each child takes the defaults back.
- Its output to /dev/null before the rest is imported: a library that looks at the terminal
  once, at import (rich's console deciding on colours), sees what a child writing to its log
  would, not the supervisor's terminal.
"""

import os
import signal

if os.getpid() != os.getpgid(0):  # not a group leader, as the server started by multiprocessing is not
    os.setsid()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
_null = os.open(os.devnull, os.O_RDWR)
os.dup2(_null, 1)
os.dup2(_null, 2)
os.close(_null)
