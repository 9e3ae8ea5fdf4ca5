"""The one way kubetrain starts a process: owned, so nothing it starts outlives it.

Every program runs in a session of its own (a terminal's signals and another program's
process-group signals never reach it by accident) under an owner that is a Linux child
subreaper: a process its program leaves behind (``sh -c 'sleep 1000 &'``, a double-forked
daemon, one started with an empty environment and so without our job identity) is re-parented
to the owner, not to init, so it stays among the owner's descendants, where it is found and
stopped. When the program ends (exit 0 included, as a container's processes end with its main
process) every process left below the owner is stopped: SIGTERM, SIGKILL after a grace.

Two kinds of owner:

* ``run`` / ``start_owned``: the program runs under a small owner process of its own
  (``python -m kubetrain.backends.owned_processes``, like a container's init): exactly its
  descendants are the program's, so the caller's other children are never touched. SIGTERM or
  SIGINT to the owner is forwarded to the program's whole tree, and so is its parent's end
  (SIGKILLed included): the owner never outlives the process that started it.
* a long-lived process that owns everything below it, the local backend's supervisor:
  ``become_owner``, ``start`` its programs, ``stop_descendants`` when it ends.

The job identity (``JOB_ID_ENV``) marks every process of a local job, so ``kubetrain delete``
finds them even when their supervisor is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psutil

from kubetrain.backends.cancel import handling_cancel_signals
from kubetrain.errors import terminal_text

#: The identity of a local job, in the environment of every process of it.
JOB_ID_ENV = "KUBETRAIN_LOCAL_JOB_ID"
#: How long a stopped program gets between SIGTERM and SIGKILL.
GRACE_SECONDS = 5.0
#: After SIGKILL, how long to wait for the kernel to take the processes away.
KILL_WAIT_SECONDS = 5.0
#: Rounds of stopping: a process may start another while being stopped, but not for ever.
MAX_STOP_ROUNDS = 10
POLL_SECONDS = 0.05
#: The first wait for stopped processes to end (doubled up to ``POLL_SECONDS``).
FIRST_POLL_SECONDS = 0.001
#: The signals an owner forwards to its program.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: prctl(2) option: orphaned descendants are re-parented to the caller (Linux 3.4+).
PR_SET_CHILD_SUBREAPER = 36
#: prctl(2) option: the kernel sends the caller a signal when its parent ends.
PR_SET_PDEATHSIG = 1
#: What an owner is sent when its parent ends. Not SIGTERM: the kernel also sends it when
#: the parent's *thread* that started the owner ends while the parent goes on (prctl(2)), and
#: a SIGTERM then could not be told from one the parent forwards. SIGHUP ("the controlling
#: process died") reaches an owner, in a session of its own without a terminal, no other way;
#: on it the owner checks that its parent is gone before it stops the program.
PARENT_GONE_SIGNAL = signal.SIGHUP
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)


def become_owner() -> bool:
    """Make this process a child subreaper: its orphaned descendants become its children
    instead of init's. False where the kernel has none (not Linux): processes are then found
    by identity and tree."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def signalled_when_parent_ends(parent: int) -> bool:
    """Have the kernel send ``PARENT_GONE_SIGNAL`` to this process when its parent ends; then
    whether ``parent`` is still its parent (it may have ended before the kernel was asked: its
    orphan was re-parented to init or a subreaper, so no signal comes). Without the prctl (not
    Linux), only the check."""
    _prctl(PR_SET_PDEATHSIG, PARENT_GONE_SIGNAL)
    return os.getppid() == parent


def _prctl(option: int, value: int) -> bool:
    """prctl(2) ``option`` set to ``value``; False where it failed or there is none. The
    standard library has no hook for prctl, hence ctypes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, int(value), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def start(argv: Sequence[str], *, env: dict[str, str], **options: Any) -> subprocess.Popen:
    """Start ``argv`` (no shell) in a session of its own with exactly ``env``, as a child of
    this process, which owns it: a ``become_owner`` process that stops what it leaves with
    ``stop_descendants``, or the local backend starting a supervisor that owns itself.
    ``options`` are ``subprocess.Popen``'s (streams, cwd, text)."""
    return subprocess.Popen(list(argv), env=env, start_new_session=True, **options)


def start_owned(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    grace_seconds: float = GRACE_SECONDS,
    spare_local_jobs: bool = False,
    **options: Any,
) -> subprocess.Popen:
    """Start ``argv`` under an owner process of its own (``main``), which exits as the
    program did once nothing it started is left. SIGTERM or SIGINT to the returned process,
    or this process's end (SIGKILL included), stops the program's whole tree; from any thread
    (``PARENT_GONE_SIGNAL``). ``spare_local_jobs``: a local job the program launched
    (carrying another ``JOB_ID_ENV``) is left running, its supervisor owns it (a pipeline
    step's launch); else nothing the program started outlives it."""
    owner = [sys.executable, "-m", __name__, "--grace", f"{grace_seconds:g}"]
    owner += ["--parent", str(os.getpid())]
    if spare_local_jobs:
        owner.append("--spare-local-jobs")
    return start([*owner, "--", *argv], env=env, **options)


def run(
    argv: Sequence[str], *, env: dict[str, str], grace_seconds: float = GRACE_SECONDS
) -> tuple[int, int | None]:
    """Run ``argv`` to its end under an owner of its own (``start_owned``), output to ours;
    (its exit code, as ``Popen.returncode``; the signal that stopped it, if we were sent
    one). SIGTERM or SIGINT to this process while it runs is forwarded to the program's whole
    tree, then returned for the caller to end with (128+N), after the program is gone."""
    program = start_owned(argv, env=env, grace_seconds=grace_seconds)
    with _forwarded_to(program) as received:
        code = program.wait()
    return code, (received[0] if received else None)


@contextlib.contextmanager
def _forwarded_to(program: subprocess.Popen) -> Iterator[list[int]]:
    """While inside, SIGTERM and SIGINT to this process are sent on to ``program`` (and
    recorded), as a wait records them (kubetrain.backends.cancel)."""
    received: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            program.send_signal(signum)

    with handling_cancel_signals(forward):
        yield received


def descendants(spare: Callable[[psutil.Process], bool] | None = None) -> list[psutil.Process]:
    """Every live process below this one (those re-parented to it as subreaper included),
    leaving out a process ``spare`` keeps and everything below it."""
    children: dict[int, list[psutil.Process]] = defaultdict(list)
    for proc in psutil.process_iter(["ppid"]):
        children[proc.info["ppid"]].append(proc)
    found: list[psutil.Process] = []
    frontier = [os.getpid()]
    while frontier:
        below = [proc for pid in frontier for proc in children.get(pid, [])]
        below = [proc for proc in below if _running(proc) and not (spare and spare(proc))]
        found.extend(below)
        frontier = [proc.pid for proc in below]
    return found


def stop_descendants(
    grace_seconds: float,
    waited_by_caller: Sequence[int] = (),
    spare: Callable[[psutil.Process], bool] | None = None,
    signum: int = signal.SIGTERM,
) -> list[int]:
    """Stop every process below this one (``descendants``): ``signum``, SIGKILL for those
    running after ``grace_seconds``, in rounds while new ones appear; then reap the orphans
    re-parented here. ``waited_by_caller``: PIDs of this process's own ``Popen`` children,
    left for their ``wait`` (reaped here, their exit code would be lost). Returns the PIDs
    stopped."""
    deadline = time.monotonic() + grace_seconds
    stopped = stop_rounds(lambda: descendants(spare), deadline, signum)
    reap_adopted(set(waited_by_caller))
    return stopped


def stop_rounds(
    find: Callable[[], list[psutil.Process]], deadline: float, signum: int = signal.SIGTERM
) -> list[int]:
    """Send ``signum`` to what ``find`` returns, SIGKILL those still running at ``deadline``;
    again while ``find`` returns more (a process may start another while being stopped)."""
    stopped: list[int] = []
    for _ in range(MAX_STOP_ROUNDS):
        processes = find()
        if not processes:
            break
        stopped.extend(proc.pid for proc in processes)
        stop_processes(processes, max(0.0, deadline - time.monotonic()), signum)
    return stopped


def stop_processes(
    processes: list[psutil.Process], grace_seconds: float, signum: int = signal.SIGTERM
) -> None:
    """Send ``signum`` to ``processes``, SIGKILL those still running after ``grace_seconds``.
    psutil signals a ``Process`` only while its PID still names the process it found, so a
    reused PID is never signalled."""
    for proc in processes:
        _send(proc, lambda p: p.send_signal(signum))
    running = still_running(processes, grace_seconds)
    for proc in running:
        _send(proc, psutil.Process.kill)
    still_running(running, KILL_WAIT_SECONDS)


def reap_adopted(waited_by_caller: set[int]) -> None:
    """Collect the exit status of this process's ended children but those in
    ``waited_by_caller``: orphans re-parented here would otherwise stay zombies."""
    with contextlib.suppress(*_GONE):
        for child in psutil.Process().children():
            if child.pid in waited_by_caller:
                continue
            with contextlib.suppress(ChildProcessError, *_GONE):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)


def _send(proc: psutil.Process, action: Callable[[psutil.Process], None]) -> None:
    with contextlib.suppress(*_GONE):
        action(proc)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except _GONE:
        return False


def still_running(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``processes`` still running once all have ended or ``timeout`` passed
    (polled, not ``psutil.wait_procs``, which would reap the caller's own children; first
    every millisecond, then less often up to ``POLL_SECONDS``: a process that ends at once
    on SIGTERM is seen gone at once, and its stopper ends right after it)."""
    deadline = time.monotonic() + timeout
    pause = FIRST_POLL_SECONDS
    while (running := [p for p in processes if _running(p)]) and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(2 * pause, POLL_SECONDS)
    return running


def of_another_local_job(own_job: str | None) -> Callable[[psutil.Process], bool]:
    """Whether a process carries a local job's identity other than ``own_job``: that job's
    supervisor owns it (a pipeline step's launch leaves it running on purpose)."""

    def spared(proc: psutil.Process) -> bool:
        try:
            job = proc.environ().get(JOB_ID_ENV)
        except (*_GONE, psutil.AccessDenied):
            return False
        return job is not None and job != own_job

    return spared


def owner_arguments(argv: list[str]) -> tuple[float, int, bool, list[str]]:
    """(grace, parent PID, spare local jobs, program) from what ``start_owned`` writes:
    ``--grace SECONDS --parent PID [--spare-local-jobs] -- PROGRAM ARGS...``. Only kubetrain
    writes them, so no argparse: a program's own ``--options`` after ``--`` are never read as
    ours."""
    if len(argv) < 6 or argv[0] != "--grace" or argv[2] != "--parent" or "--" not in argv[4:]:
        raise SystemExit(
            f"usage: python -m {__name__} --grace SECONDS --parent PID [--spare-local-jobs] "
            "-- PROGRAM"
        )
    end = argv.index("--", 4)
    return float(argv[1]), int(argv[3]), "--spare-local-jobs" in argv[4:end], argv[end + 1 :]


def signals_wake() -> Callable[[float], None]:
    """A wait of up to N seconds that a signal with a Python handler ends at once (its
    handler has run when it returns): the owner stops its program as soon as it is told to,
    not at its next poll, and is gone right after the program's processes are."""
    wakeup_read, wakeup_write = os.pipe()
    for end in (wakeup_read, wakeup_write):
        os.set_blocking(end, False)
    signal.set_wakeup_fd(wakeup_write)

    def wait(seconds: float) -> None:
        if select.select([wakeup_read], [], [], seconds)[0]:
            with contextlib.suppress(BlockingIOError):
                os.read(wakeup_read, 512)  # drained, or a signal ignored would wake it for ever

    return wait


def main(argv: list[str]) -> int:
    """The owner of one program: start it, forward SIGTERM/SIGINT to its tree (its parent's
    end is a SIGTERM), and once it has ended stop whatever it left; exit as it did (by its
    signal, if one ended it)."""
    grace, parent, spare_local_jobs, program_argv = owner_arguments(argv)
    spare = of_another_local_job(os.environ.get(JOB_ID_ENV)) if spare_local_jobs else None
    received: list[int] = []

    def stop_program(signum: int, _frame: Any) -> None:
        received.append(signum)

    def stop_program_if_orphaned(_signum: int, _frame: Any) -> None:
        if os.getppid() != parent:  # else only the parent's thread that started us ended
            received.append(signal.SIGTERM)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, stop_program)
    signal.signal(PARENT_GONE_SIGNAL, stop_program_if_orphaned)
    wait_for_a_signal = signals_wake()
    if not signalled_when_parent_ends(parent):
        return 128 + signal.SIGTERM  # the parent ended before the program started: none runs
    become_owner()
    try:
        program = start(program_argv, env=dict(os.environ))
    except OSError as exc:
        print(terminal_text(f"cannot start {program_argv[0]}: {exc.strerror}"), file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    while program.poll() is None and not received:
        wait_for_a_signal(POLL_SECONDS)
    # The signal we were sent, if any, goes to the program and everything below it.
    signum = received[0] if received else signal.SIGTERM
    stop_descendants(grace, waited_by_caller=[program.pid], spare=spare, signum=signum)
    code = program.wait()
    if code < 0:  # ended by a signal: end by it too, so our parent sees what the program did
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP take no handler
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
