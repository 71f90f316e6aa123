"""Instance processes forked from a preloaded one: ``python -m packrat.serving.pool.forkserver FD PARENT_PID``.

A fresh interpreter spends about 1.9 s of CPU importing torch before an instance loads its model;
a pool starts one per instance, again at every respawn and switch. The fork server imports the
instance's code once, then forks a child per instance, which runs child.main as a fresh process
would. It stays single-threaded (fork copies only the calling thread), and it is not the caller's
process forked (that would copy the server's threads and torch state) nor multiprocessing's
forkserver (which imports the caller's __main__ again in every child).

What a child cannot take from the fork server it gets with each request: the caller's working
directory and environment. What libraries read once, as they load (OpenMP's and torch's
variables), cannot change after the fork: a caller whose values differ from a server's gets a
server of its own, and an instance whose environment is set for it alone (IOS's OpenMP settings)
starts as a fresh interpreter (instance.py).

The server is its children's parent, so it reaps them and says their exit codes when asked; the
caller waits on a pidfd of each child, which the server opens while the child cannot yet have been
reaped. Without pidfds (Linux before 5.3) nothing is forked.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading

from packrat.machine.threads import name_thread

# read by libraries as they load: a child forked later could not change them
LOAD_TIME_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "DNNL_", "ONEDNN_", "TORCH", "PYTORCH",
                      "LD_", "PYTHON", "MALLOC_", "GLIBC_")
NAME = "packrat-forks"  # the server's process name (psutil's name()): its children are instances, it is not
MESSAGE_BYTES = 1 << 20  # a request: the caller's directory and environment
REAP_EVERY_S = 1.0
SPAWN_TIMEOUT_S = 60.0  # the server's first answer waits for its imports; one stuck past this is left for a fresh interpreter


class Forked:
    """A forked instance process: the part of subprocess.Popen the pool uses (pid, poll, wait, kill)."""

    def __init__(self, server: "ForkServer", pid: int, pidfd: int):
        self.pid, self.returncode = pid, None
        self._server, self._pidfd = server, pidfd
        self._asking = threading.Lock()  # the server says an exit code once: the first to ask keeps it

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:  # readable once it has exited
                raise subprocess.TimeoutExpired(f"instance {self.pid}", timeout)
            with self._asking:
                if self.returncode is None:
                    self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:  # exited already
                pass

    def __del__(self) -> None:
        try:
            os.close(self._pidfd)
        except (OSError, AttributeError):
            pass


class ForkServer:
    """One fork server process, started on first use: spawn() forks an instance from it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.process: subprocess.Popen | None = None

    def spawn(self, child_fd: int, parent: int) -> Forked | None:
        """An instance process running child.main on `child_fd` (which stays the caller's to
        close), or None where the server cannot fork one (gone, or failed): start it afresh."""
        request = pickle.dumps((os.getcwd(), dict(os.environ), parent))
        with self._lock:
            try:
                if self._sock is None:
                    self._start()
                socket.send_fds(self._sock, [request], [child_fd])
                reply, fds, _, _ = socket.recv_fds(self._sock, 64, 1)
            except OSError:
                self._stop()
                return None
            if not reply or not fds:
                self._stop()
                return None
            return Forked(self, int(reply), fds[0])

    def exit_code(self, pid: int) -> int:
        """An exited child's exit code (-N: killed by signal N); 1 where the server is gone."""
        with self._lock:
            try:
                self._sock.send(f"status {pid}".encode())
                return int(self._sock.recv(64))
            except (OSError, ValueError, AttributeError):
                return 1

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.detach()
        self.process = subprocess.Popen([sys.executable, "-m", "packrat.serving.pool.forkserver", str(fd),
                                         str(os.getpid())], pass_fds=(fd,))
        os.close(fd)
        ours.settimeout(SPAWN_TIMEOUT_S)
        self._sock = ours

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


_servers: dict[tuple, ForkServer] = {}
_servers_lock = threading.Lock()


def spawn(child_fd: int, parent: int) -> Forked | None:
    """A forked instance process (see ForkServer.spawn), from the server for this interpreter and
    the environment its libraries load with; None where forking is not to be had here."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return None
    key = (sys.executable, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(LOAD_TIME_PREFIXES))))
    with _servers_lock:
        server = _servers.setdefault(key, ForkServer())
    return server.spawn(child_fd, parent)


# ---- the server's side ------------------------------------------------------------------------

def serve(sock: socket.socket, parent: int) -> None:
    """Fork a child for each request until the caller's end of `sock` closes."""
    from packrat.serving.pool import child  # the preload: torch and the instance's code

    watched = child.parent_pidfd(parent)  # inherited by every child: it watches the caller, not us
    if watched is None:
        return  # the caller is gone (or no pidfds): each spawn() then starts a fresh interpreter
    codes: dict[int, int] = {}
    while True:
        if select.select([sock], [], [], REAP_EVERY_S)[0]:
            message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 1)
            if not message:
                return  # the caller closed its end, or exited
            if fds:
                pid = fork_instance(sock, fds[0], watched, message)
                pidfd = os.pidfd_open(pid)  # before any reaping: the pid cannot name another process yet
                socket.send_fds(sock, [str(pid).encode()], [pidfd])
                os.close(pidfd)
            else:
                pid = int(message.split()[1])
                sock.send(str(codes.pop(pid) if pid in codes else reap(pid)).encode())
        reap_exited(codes)


def fork_instance(sock: socket.socket, child_fd: int, watched: int, message: bytes) -> int:
    """Fork one instance (its pid); the child never returns from here."""
    cwd, environ, parent = pickle.loads(message)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(child_fd)
        return pid
    code = 1
    try:
        sock.close()
        name_thread("python")  # as a fresh interpreter's: the server's name is the server's alone
        signal.signal(signal.SIGINT, signal.default_int_handler)
        become(cwd, environ)
        from multiprocessing.connection import Connection

        from packrat.serving.pool import child

        child.main(Connection(child_fd), parent, watched)
        code = 0
    except BaseException:  # noqa: BLE001 - said on stderr, as a fresh interpreter would
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def become(cwd: str, environ: dict) -> None:
    """The caller's directory and environment, as a fresh interpreter started now would have them."""
    import random
    import tempfile

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    tempfile.tempdir = None  # found again from TMPDIR
    random.seed()


def reap(pid: int) -> int:
    try:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except ChildProcessError:
        return 1


def reap_exited(codes: dict) -> None:
    """Exited children's codes kept until asked for, so none stays a zombie meanwhile."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        codes[pid] = os.waitstatus_to_exitcode(status)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the caller's to handle
    name_thread(NAME)
    serve(socket.socket(fileno=int(sys.argv[1])), int(sys.argv[2]))


if __name__ == "__main__":
    main()
