"""A throw-away PostgreSQL server for tests: Debian's ``postgresql`` binaries, a temporary data directory,
TCP on 127.0.0.1 with a free port (a new one if another process takes it first), trust authentication,
stopped and removed at the end.

PostgreSQL refuses to run as root, so under root the server runs as the ``postgres`` system user that
Debian's package creates.  :func:`start` returns None with a reason wherever it cannot start.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass


@dataclass
class Server:
    url: str
    data_dir: str
    pg_ctl: str
    user: str | None

    def stop(self) -> None:
        _run([self.pg_ctl, "-D", f"{self.data_dir}/data", "-m", "immediate", "stop"], self.user, check=False)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _bin_dir() -> str | None:
    for path in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(f"{path}/initdb", os.X_OK) and os.access(f"{path}/pg_ctl", os.X_OK):
            return path
    found = shutil.which("initdb")
    return os.path.dirname(found) if found and shutil.which("pg_ctl") else None


def _run(cmd: list[str], user: str | None, check: bool = True) -> subprocess.CompletedProcess:
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=check)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start() -> Server | str:
    """Start a server; returns the :class:`Server`, or a string saying why it cannot start."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        return "PostgreSQL is not installed (apt-get install postgresql)"
    user = None
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing"
        user = "postgres"
    base = tempfile.mkdtemp(prefix="archspec-pg-")
    if user is not None:
        os.chown(base, pw.pw_uid, pw.pw_gid)
    try:
        _run([f"{bin_dir}/initdb", "-D", f"{base}/data", "-U", "archspec", "--auth=trust", "-E", "UTF8"], user)
        for attempt in range(3):
            # the port was free when the kernel named it, but tests run in parallel (pytest-xdist) beside other
            # programs: another process may take it before the server binds it; then try a new one
            port = _free_port()
            try:
                _run([f"{bin_dir}/pg_ctl", "-D", f"{base}/data", "-w", "-t", "60", "-l", f"{base}/log", "-o",
                      f"-c listen_addresses=127.0.0.1 -p {port} -k {base} -c max_connections=200", "start"], user)
                break
            except subprocess.CalledProcessError:
                if attempt == 2 or "already in use" not in _log(base):
                    raise
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        log = (getattr(exc, "stderr", "") or "") + _log(base)
        shutil.rmtree(base, ignore_errors=True)
        return f"PostgreSQL did not start: {exc} {log[-300:]}"
    return Server(f"postgresql://archspec@127.0.0.1:{port}/postgres", base, f"{bin_dir}/pg_ctl", user)


def _log(base: str) -> str:
    """The server's log so far ('' before it exists)."""
    try:
        with open(f"{base}/log", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""
