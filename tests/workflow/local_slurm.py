"""A real single-node SLURM cluster for the tests: Debian's slurm-wlm and munge, every file of it
(config, keys, sockets, state, logs, job records) in one private folder, its daemons children of
the test process.

Client commands find this cluster through wrappers in `<root>/bin` that set SLURM_CONF
themselves, rather than through SLURM_CONF in the environment: snakemake-executor-plugin-slurm's
jobstep (0.6.1) removes every SLURM_* variable but a few job ids before it runs `srun` inside a
job, SLURM_CONF included, and an `srun` without a config falls back to a DNS SRV lookup that
fails. `sbatch --export=ALL` carries PATH into the job, so the job's `srun` is the wrapper too.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel", "sacct")
PARTITION = "linvit"
# The plugin's job-status query: squeue --format='%i|%T' (snakemake-executor-plugin-slurm 2.x).
STATUS_QUERY = "%i|%T"
STALL_SECONDS = 15     # an interrupt sent within this of the check starting lands in it


# where Debian puts them, whether or not the sbin folders are on PATH
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin",
                               "/bin"])


class Unavailable(Exception):
    """SLURM cannot run here (not installed and not installable): the tests skip, saying why."""


def program(name: str) -> str:
    """The full path of a SLURM or munge program (never one of LocalSlurm's wrappers)."""
    found = shutil.which(name, path=SEARCH_PATH)
    if not found:
        raise Unavailable(f"{name} is not installed")
    return found


def ensure_installed() -> None:
    """Install slurm-wlm and munge from Debian when one of their programs is missing."""
    if all(shutil.which(p, path=SEARCH_PATH) for p in (*DAEMONS, *CLIENTS)):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable("slurm-wlm and munge are not installed, and installing them needs root "
                          "and apt-get (apt-get install slurm-wlm munge)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if run.returncode != 0:
            raise Unavailable(f"{' '.join(cmd)} failed: {run.stderr.strip()[-500:]}")


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now (held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_for(what: str, check, timeout: float, log: Path | None = None):
    """Poll `check()` until it returns something true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    tail = log.read_text()[-2000:] if log and log.is_file() else ""
    raise RuntimeError(f"local SLURM: {what} not within {timeout:.0f} s\n{tail}")


class LocalSlurm:
    """munged, slurmctld and slurmd for this host (its cores and memory, one partition), no
    accounting database, a job-completion record file. `start()`, then `env()` for the commands
    that use it, `stop()` at the end."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.bin = self.root / "bin"
        self.conf = self.root / "slurm.conf"
        self.jobcomp = self.root / "jobcomp.txt"
        self.procs: dict[str, subprocess.Popen] = {}
        self.node = ""
        self.stall_flag = self.root / "stall-status-checks"
        self.stalling = self.root / "status-check-stalling"

    def env(self, base: dict | None = None) -> dict:
        """An environment whose SLURM commands reach this cluster."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return env

    def client(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env(), capture_output=True, text=True,
                              timeout=timeout)

    def start(self) -> None:
        ensure_installed()
        for part in ("state", "spool", "log", "munge"):
            (self.root / part).mkdir(parents=True, exist_ok=True)
        self._write_wrappers()
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", [program("slurmctld"), "-D", "-f", str(self.conf)])
        self._spawn("slurmd", [program("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
        wait_for("the node idle", self._node_idle, 90, self.root / "log" / "slurmctld.log")

    def stop(self) -> None:
        """Cancel what is left of the jobs, then end the daemons (last started first)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.client("scancel", "--user", str(os.getuid()))
            # a job still running after that ends with its step when slurmd stops
            with contextlib.suppress(RuntimeError):
                self.wait_for_empty_queue("the jobs cancelled", 60)
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    @contextlib.contextmanager
    def stalled_status_checks(self):
        """Inside: each job-status query of the plugin takes STALL_SECONDS more. Yields a
        function that waits until such a query is under way (an interrupt sent then lands while
        Snakemake checks its jobs)."""
        self.stalling.unlink(missing_ok=True)
        self.stall_flag.touch()
        try:
            yield lambda: wait_for("a stalled status check", self.stalling.exists, 120)
        finally:
            self.stall_flag.unlink(missing_ok=True)

    def queue(self) -> list[str]:
        """Ids of the jobs SLURM has pending or running."""
        run = self.client("squeue", "-h", "-o", "%i")
        return run.stdout.split() if run.returncode == 0 else ["?"]

    def wait_for_empty_queue(self, what: str, timeout: float, jobs=None) -> None:
        """Wait until no job (or none of `jobs()`) is pending or running; else fail showing the
        jobs left, their processes and the daemons' logs (a stuck job is otherwise a bare id)."""
        jobs = jobs or self.queue
        try:
            wait_for(what, lambda: not jobs(), timeout)
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{self.describe()}") from None

    def describe(self) -> str:
        """The queue with states and reasons, each job left, and the daemons' log tails."""
        parts = [self.client("squeue", "-o", "%i %T %j %r %M %Z").stdout]
        for job in self.queue():
            parts.append(self.client("scontrol", "show", "job", job).stdout)
        parts.append(subprocess.run(["ps", "-eo", "pid,ppid,stat,etime,args"],
                                    capture_output=True, text=True).stdout[-4000:])
        for name in ("slurmctld", "slurmd"):
            log = self.root / "log" / f"{name}.log"
            if log.is_file():
                parts.append(f"--- {name}.log\n" + log.read_text()[-3000:])
        return "\n".join(parts)

    def cancel_from(self, workdir: Path) -> None:
        """Cancel the pending or running jobs submitted from `workdir`."""
        run = self.client("squeue", "-h", "-o", "%i %Z")
        jobs = [line.split(" ", 1) for line in run.stdout.splitlines() if " " in line]
        ids = [job for job, folder in jobs if Path(folder) == Path(workdir)]
        if ids:
            self.client("scancel", *ids)

    def completed_jobs(self) -> list[dict]:
        """The job-completion records (jobcomp/filetxt: one line of KEY=value per ended job)."""
        if not self.jobcomp.is_file():
            return []
        return [dict(re.findall(r"(\w+)=(\S*)", line))
                for line in self.jobcomp.read_text().splitlines() if line.strip()]

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")   # noqa: SIM115 (the child's stdout)
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env())
        log.close()

    def _write_wrappers(self) -> None:
        self.bin.mkdir(exist_ok=True)
        for name in CLIENTS:
            target = program(name)
            wrapper = self.bin / name
            stall = ""
            if name == "squeue":                 # see stalled_status_checks
                flag, stalling = (shlex.quote(str(p)) for p in (self.stall_flag, self.stalling))
                stall = (f"case \"$*\" in *{shlex.quote(STATUS_QUERY)}*) if [ -e {flag} ]; "
                         f"then touch {stalling}; sleep {STALL_SECONDS}; fi;; esac\n")
            wrapper.write_text(f"#!/bin/sh\n{stall}SLURM_CONF={shlex.quote(str(self.conf))} "
                               f"exec {shlex.quote(target)} \"$@\"\n")
            wrapper.chmod(0o755)

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.munge_socket = munge / "munge.socket"
        self._spawn("munged", [program("munged"), "--foreground", "--force", f"--key-file={key}",
                               f"--socket={self.munge_socket}", f"--pid-file={munge}/munged.pid",
                               f"--log-file={munge}/munged.log", f"--seed-file={munge}/seed"])
        wait_for("munged's socket", self.munge_socket.exists, 30, munge / "munged.log")

    def _write_conf(self) -> None:
        hardware = subprocess.run([program("slurmd"), "-C"], capture_output=True, text=True,
                                  check=True).stdout
        node_line = hardware.splitlines()[0]                   # NodeName=... CPUs=... RealMemory=
        self.node = re.search(r"NodeName=(\S+)", node_line).group(1)
        ctld, slurmd = free_ports(2)
        root, log = self.root, self.root / "log"
        (root / "plugstack.conf").write_text("")
        self.conf.write_text("\n".join([
            "ClusterName=linvit", f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld}", f"SlurmdPort={slurmd}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
            f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
            f"SlurmctldLogFile={log}/slurmctld.log", f"SlurmdLogFile={log}/slurmd.log",
            f"PlugStackConfig={root}/plugstack.conf",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={self.jobcomp}",
            # squeue-based job status needs ended jobs to stay visible for a while
            "MinJobAge=600", "ReturnToService=2", "MpiDefault=none",
            # a cancelled job's processes get SIGKILL this soon after SIGTERM
            "KillWait=5",
            f"{node_line} NodeAddr=127.0.0.1 State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            ""]))

    def _node_idle(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                out = (self.root / "log" / f"{name}.out").read_text()[-2000:]
                raise RuntimeError(f"local SLURM: {name} exited ({proc.returncode})\n{out}")
        run = self.client("sinfo", "-h", "-N", "-o", "%t")
        return run.returncode == 0 and run.stdout.split() == ["idle"]
