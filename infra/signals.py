"""SIGTERM and SIGINT as a `threading.Event` that every service loop waits on.

The Python-level handler does nothing. A handler runs on the main thread between two
bytecodes, possibly inside the very `Event.wait()` that holds the event's lock at that moment.
Setting the event from there deadlocks the process: the lock is not reentrant (a master
resumed from SIGSTOP and then sent SIGTERM would hang for good). So the
signal's number travels through `signal.set_wakeup_fd`, and a watcher thread sets the event.
SIGUSR1 prints every thread's stack to stderr, for a process that seems stuck.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_CLOSE = 0  # no signal has number 0: the byte that ends the watcher


def stop_on_signals() -> threading.Event:
    """For a command's whole life: the returned event is set on SIGTERM or SIGINT."""
    stop = threading.Event()
    _install(stop)
    return stop


def handle_stop_signals(stop: threading.Event) -> Callable[[], None]:
    """The same until the returned function is called, which restores the previous handlers;
    a no-op off the main thread (where handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    return _install(stop)


def _install(stop: threading.Event) -> Callable[[], None]:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, _ignore) for sig in STOP_SIGNALS}
    watcher = threading.Thread(target=_watch, args=(read_fd, stop), name="stop-signals", daemon=True)
    watcher.start()

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        os.write(write_fd, bytes([_CLOSE]))
        watcher.join(5)
        os.close(write_fd)

    return restore


def _ignore(signum, frame) -> None:
    """The byte in the wakeup fd is what counts (see the module doc)."""


def _watch(read_fd: int, stop: threading.Event) -> None:
    try:
        while data := os.read(read_fd, 64):
            if any(b in STOP_SIGNALS for b in data):
                stop.set()
            if _CLOSE in data:
                return
    finally:
        os.close(read_fd)
