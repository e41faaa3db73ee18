"""Stop signals: a SIGTERM that lands while the main thread holds the stop event's own lock
must still stop the process (setting the event in the handler deadlocked there)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

from streamtrain.infra.signals import handle_stop_signals


def run_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=30)


def test_a_sigterm_inside_the_events_own_lock_still_stops() -> None:
    done = run_child("""
        import os, signal
        from streamtrain.infra.signals import stop_on_signals
        stop = stop_on_signals()
        handler, ran = signal.getsignal(signal.SIGTERM), []
        signal.signal(signal.SIGTERM, lambda *args: (ran.append(1), handler(*args)))
        with stop._cond:  # where Event.wait() is between its waiter and its return
            os.kill(os.getpid(), signal.SIGTERM)
            while not ran:  # the handler runs here, on this thread, with the lock held
                pass
        assert stop.wait(10), "not stopped"
        print("stopped")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr


def test_sigint_stops_too_and_sigusr1_prints_the_stacks() -> None:
    done = run_child("""
        import os, signal, sys
        from streamtrain.infra.signals import stop_on_signals
        stop = stop_on_signals()
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.wait(10), "not stopped"
        print("stopped")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr
    assert "most recent call first" in done.stderr and "stop-signals" not in done.stdout


def test_restoring_puts_the_previous_handlers_and_wakeup_fd_back() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    restore = handle_stop_signals(stop)
    assert signal.getsignal(signal.SIGTERM) is not before[0]
    restore()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert signal.set_wakeup_fd(-1) == -1
    assert not stop.is_set()
    assert not [t for t in threading.enumerate() if t.name == "stop-signals"]
