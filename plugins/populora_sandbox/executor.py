"""Parent side of the sandbox: a pool of zygotes (one per core and hash variant) and the batch API.

The trainer never forks itself: each zygote is a fresh, small interpreter started with a scrubbed
environment (see ``_zygote.py``), so model code never shares memory with the trainer. One thread in
the caller drives every zygote through pipes (``selectors``), keeps a deadline per job and
replaces a zygote that dies or stops answering.
"""

from __future__ import annotations

import itertools
import json
import marshal
import os
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from populora_core.api.components import ExecJob, ExecResult, Executor
from populora_core.api.errors import UserError

from .params import SandboxParams

_ZYGOTE = str(Path(__file__).with_name("_zygote.py"))
_COUNTER = itertools.count()
_FALLBACK_PREFIX = "populora-sandbox-"
_UID_BLOCK = 1024  # uids per executor: hash variant (< 16) * 64 + worker slot (< 64)
_DEPTH = 2  # jobs queued per zygote: the next one is there when the current one ends
_STATUSES = ("ok", "error", "timeout", "memory", "killed", "output_too_large")


class SandboxStartError(RuntimeError):
    """A zygote could not start (bad module list, broken interpreter): a setup error, not a program's."""


class SyscallFilterUnavailable(SandboxStartError, UserError):
    """The system-call filter cannot be installed here and the params did not opt out: the sandbox refuses to start
    (exit 2 from the command line, naming the reason and the opt-out)."""


#: seccomp bindings tried in this order in the zygote: libseccomp's own (Debian's python3-seccomp), then PyPI's
#: pyseccomp (the project's dependency), both over the system's libseccomp.so.2.
SECCOMP_BINDINGS: tuple[str, ...] = ("seccomp", "pyseccomp")
#: Where Python libraries live outside the interpreter's own prefixes: hidden from programs like those prefixes,
#: so no native module a program may not import is on any path it can reach.
PYTHON_LIBRARY_GLOBS = ("/usr/lib/python*", "/usr/lib64/python*", "/usr/local/lib/python*", "/usr/local/lib64/python*")


@dataclass
class _Worker:
    """One zygote process and the bookkeeping of the job it runs."""

    variant: int
    slot: int
    uid: int
    proc: subprocess.Popen
    isolation: dict[str, Any]
    fallback_tmp: str
    grace: float
    buf: bytearray = field(default_factory=bytearray)
    inflight: deque[tuple[int, float]] = field(default_factory=deque)  # (job index, timeout), head runs
    head_started: float = 0.0

    @property
    def deadline(self) -> float:
        """When the running job should have answered at the latest (its timeout plus a grace)."""
        return self.head_started + self.inflight[0][1] + self.grace if self.inflight else float("inf")

    @property
    def fd(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()


@dataclass
class _Batch:
    """The scheduling state of one ``run_batch`` call, which every feed and retire step works on."""

    jobs: list[ExecJob]
    queues: dict[int, deque[int]]  # hash variant -> indices of the jobs not sent yet
    sel: selectors.BaseSelector
    active: dict[int, _Worker] = field(default_factory=dict)  # fd -> worker with jobs in flight


class SandboxExecutor(Executor):
    """Runs untrusted Python programs, each in its own isolated process; see the package README."""

    def __init__(self, params: SandboxParams | None = None) -> None:
        self.params = params or SandboxParams()
        self.workers = self.params.workers or (os.cpu_count() or 1)
        # A block of uids of our own (one per zygote): RLIMIT_NPROC counts per uid, system-wide.
        blocks = max(self.params.uid_span // _UID_BLOCK, 1)
        self._uid_base = self.params.uid_base + ((os.getpid() * 8 + next(_COUNTER)) % blocks) * _UID_BLOCK
        self._pool: dict[int, list[_Worker]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._tmp_root = Path(tempfile.gettempdir())
        if not self.params.syscall_filter:
            import warnings

            warnings.warn(
                "sandbox: running model-written programs without the system-call filter (syscall_filter: false): "
                "they can reach unshare, mount, ptrace, bpf and the rest of the kernel's surface",
                UserWarning,
                stacklevel=2,
            )
        self._cleanup_stale_fallback_dirs()
        self._ensure_variant(0)
        self._isolation: dict[str, Any] = dict(self._pool[0][0].isolation)

    # --- public API ------------------------------------------------------------------------------

    @property
    def isolation(self) -> dict[str, Any]:
        """What isolation the zygotes actually got (namespaces, uid, fallback reason)."""
        return dict(self._isolation)

    @property
    def uids(self) -> list[int]:
        """The uids programs of this executor may run as (for tests that look for strays)."""
        return [self._uid_base + i for i in range(_UID_BLOCK)]

    def cpu_seconds(self) -> float:
        """CPU time used so far by all zygotes and the programs they reaped (for benchmarks/metrics).

        Counts the serving process and its template (whose children are the programs); programs
        still running and a zygote's own start-up are not counted.
        """
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for workers in self._pool.values():
            for worker in workers:
                z = worker.proc.pid
                server = z
                if worker.isolation.get("pid_namespace"):
                    kids = _child_pids(z)
                    server = kids[0] if kids else z
                for pid in [server, *_child_pids(server)]:
                    try:
                        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    except (OSError, IndexError):
                        continue
                    total += sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
        return total

    def run(self, code: str, expr: str | None = None, **kwargs: Any) -> ExecResult:
        """Convenience: one job."""
        return self.run_batch([ExecJob(code, expr, **kwargs)])[0]

    def run_batch(self, jobs: Sequence[ExecJob]) -> list[ExecResult]:
        """Run ``jobs`` on all zygotes; results in job order. Never raises for what a program does."""
        if self._closed:
            raise RuntimeError("SandboxExecutor is closed")
        for job in jobs:
            if not 0 <= job.hash_variant < self.params.max_hash_variants:
                raise ValueError(
                    f"ExecJob.hash_variant must be in [0, {self.params.max_hash_variants}), got {job.hash_variant}"
                )
        with self._lock:
            return self._run_locked(list(jobs))

    def close(self) -> None:
        """Stop every zygote (their namespaces die with them) and remove fallback temp dirs."""
        if self._closed:
            return
        self._closed = True
        for workers in self._pool.values():
            for worker in workers:
                self._stop(worker)
        self._pool.clear()

    def __enter__(self) -> SandboxExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # --- scheduling -----------------------------------------------------------------------------

    def _run_locked(self, jobs: list[ExecJob]) -> list[ExecResult]:
        results: list[ExecResult | None] = [None] * len(jobs)
        queues: dict[int, deque[int]] = {}
        for i, job in enumerate(jobs):
            queues.setdefault(job.hash_variant, deque()).append(i)
        for variant in queues:
            self._ensure_variant(variant)
        batch = _Batch(jobs, queues, selectors.DefaultSelector())
        retried: dict[int, int] = {}
        pending = len(jobs)
        try:
            for variant in queues:
                for worker in list(self._pool[variant]):
                    if worker.proc.poll() is not None:  # died while idle (killed from outside)
                        self._replace(worker)
                self._feed_idle(variant, batch)
            while pending:
                now = time.monotonic()
                wait = max(0.0, min(w.deadline for w in batch.active.values()) - now) if batch.active else 0.0
                for key, _ in batch.sel.select(timeout=wait):
                    worker = key.data
                    fill = True
                    while worker.inflight:  # one read may bring several replies
                        reply = self._read_reply(worker, fill)
                        fill = False
                        if reply is False:
                            break
                        index, _timeout = worker.inflight.popleft()
                        if reply is None:  # the zygote died under this job: retry it once elsewhere
                            retried[index] = retried.get(index, 0) + 1
                            if retried[index] > 1:
                                results[index] = ExecResult(
                                    "killed",
                                    error="SandboxError: worker died",
                                    wall_s=time.monotonic() - worker.head_started,
                                )
                                pending -= 1
                            else:
                                worker.inflight.appendleft((index, _timeout))
                            worker = self._retire(worker, batch)
                            break
                        results[index] = _to_result(reply)
                        pending -= 1
                        worker.head_started = time.monotonic()
                    self._feed_idle(worker.variant, batch)
                now = time.monotonic()
                for worker in list(batch.active.values()):
                    if worker.inflight and now > worker.deadline:  # hung: should have answered long ago
                        index, _timeout = worker.inflight.popleft()
                        results[index] = ExecResult(
                            "killed", error="SandboxError: worker hung, replaced", wall_s=now - worker.head_started
                        )
                        pending -= 1
                        fresh = self._retire(worker, batch)
                        self._feed_idle(fresh.variant, batch)
        except BaseException:
            # KeyboardInterrupt or a bug here: zygotes mid-job are in an unknown state, replace them.
            for worker in list(batch.active.values()):
                self._retire(worker, batch)
            raise
        finally:
            batch.sel.close()
        return [r if r is not None else ExecResult("killed", error="SandboxError: not run") for r in results]

    def _feed_idle(self, variant: int, batch: _Batch) -> None:
        """Give every idle zygote of ``variant`` a job before any gets a second one (load balance)."""
        for depth in range(1, _DEPTH + 1):
            for worker in self._pool[variant]:
                self._feed(worker, batch, depth)

    def _feed(self, worker: _Worker, batch: _Batch, depth: int = _DEPTH) -> None:
        """Keep up to ``depth`` jobs queued in a zygote so it never waits for this process."""
        queue = batch.queues.get(worker.variant)
        while queue and len(worker.inflight) < depth:
            self._send_job(worker, queue.popleft(), batch.jobs)
        if worker.inflight and worker.fd not in batch.active:
            batch.sel.register(worker.fd, selectors.EVENT_READ, worker)
            batch.active[worker.fd] = worker
        elif not worker.inflight and worker.fd in batch.active:
            batch.sel.unregister(worker.fd)
            del batch.active[worker.fd]

    def _retire(self, worker: _Worker, batch: _Batch) -> _Worker:
        """Replace a dead or hung zygote; jobs it had queued but not started go back to the queue."""
        if worker.fd in batch.active:
            batch.sel.unregister(worker.fd)
            del batch.active[worker.fd]
        queue = batch.queues.setdefault(worker.variant, deque())
        for index, _timeout in reversed(worker.inflight):
            queue.appendleft(index)
        worker.inflight.clear()
        return self._replace(worker)

    def _send_job(self, worker: _Worker, index: int, jobs: list[ExecJob]) -> None:
        job = jobs[index]
        timeout = float(job.timeout_s if job.timeout_s is not None else self.params.timeout_s)
        message = {
            "code": job.code,
            "expr": job.expr,
            "timeout_s": timeout,
            "memory_mb": int(job.memory_mb if job.memory_mb is not None else self.params.memory_mb),
            "max_output_bytes": int(self.params.max_output_bytes),
        }
        data = json.dumps(message).encode()
        if not worker.inflight:
            worker.head_started = time.monotonic()
            worker.buf.clear()
        worker.inflight.append((index, timeout))
        try:
            assert worker.proc.stdin is not None
            worker.proc.stdin.write(struct.pack(">I", len(data)) + data)
        except OSError:
            pass  # a dead zygote shows up as EOF on its output

    def _read_reply(self, worker: _Worker, fill: bool = True) -> dict[str, Any] | Literal[False] | None:
        """Next reply: a dict, None on EOF or garbage (dead zygote), False while bytes are missing.

        ``fill=False`` only parses what is already buffered (never blocks).
        """
        if fill and not self._buffered(worker):
            try:
                chunk = os.read(worker.fd, 1 << 20)
            except OSError:
                return None
            if not chunk:
                return None
            worker.buf += chunk
        if not self._buffered(worker):
            return False
        size = struct.unpack(">I", worker.buf[:4])[0]
        body = bytes(worker.buf[4 : 4 + size])
        del worker.buf[: 4 + size]
        try:
            reply = json.loads(body)
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None

    @staticmethod
    def _buffered(worker: _Worker) -> bool:
        """Whether one complete message is in the buffer."""
        return len(worker.buf) >= 4 and len(worker.buf) >= 4 + struct.unpack(">I", worker.buf[:4])[0]

    # --- zygote lifecycle -------------------------------------------------------------------------

    def _ensure_variant(self, variant: int) -> None:
        if variant in self._pool:
            return
        starting = [self._spawn(variant, slot) for slot in range(self.workers)]
        self._pool[variant] = [self._await_ready(*s) for s in starting]

    def _uid(self, variant: int, slot: int) -> int:
        return self._uid_base + variant * 64 + slot

    def _hash_seed(self, variant: int) -> int:
        # Different variants always get different seeds; the executor seed makes runs reproducible.
        return (self.params.seed * 7919 + variant * 104729 + 1) % 4294967295

    def _config(self, variant: int, slot: int, fallback_tmp: str) -> dict[str, Any]:
        p = self.params
        hide = list(p.hide_paths)
        for extra in (os.path.realpath(os.getcwd()), os.path.realpath(os.path.expanduser("~"))):
            # the trainer's own dirs, unless that would hide a whole system dir (cwd = /usr)
            private = any(extra == t or extra.startswith(t.rstrip("/") + "/") for t in p.tmp_dirs)
            if extra != "/" and extra not in p.visible_top_level and not private and extra not in hide:
                hide.append(extra)
        hide += [d for d in _python_library_dirs() if d not in hide]
        return {
            "sys_path": [x for x in sys.path if x and os.path.isdir(x)],
            "modules": list(dict.fromkeys([*_SUPPORT_MODULES, *p.modules, *p.extra_modules])),
            "parent_pid": os.getpid(),
            "pdeathsig": threading.current_thread() is threading.main_thread(),
            "namespaces": p.namespaces,
            "syscall_filter": p.syscall_filter,
            "seccomp_bindings": list(SECCOMP_BINDINGS),
            "uid": self._uid(variant, slot),
            "max_file_mb": p.max_file_mb,
            "max_open_files": p.max_open_files,
            "max_processes": p.max_processes,
            "tmpfs_mb": p.tmpfs_mb,
            "tmpfs_inodes": p.tmpfs_inodes,
            "tmp_dirs": list(p.tmp_dirs),
            "hide_paths": hide,
            "visible_top_level": list(p.visible_top_level),
            "fallback_tmp": fallback_tmp,
        }

    def _spawn(self, variant: int, slot: int) -> tuple[int, int, str, subprocess.Popen, float]:
        # Created by the zygote only in fallback mode (with namespaces everything lives in its tmpfs).
        fallback_tmp = str(self._tmp_root / f"{_FALLBACK_PREFIX}{os.getpid()}-{next(_COUNTER)}")
        cfg = self._config(variant, slot, fallback_tmp)
        env = {
            "PYTHONHASHSEED": str(self._hash_seed(variant)),
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        debug = os.environ.get("POPULORA_SANDBOX_DEBUG")
        proc = subprocess.Popen(
            [sys.executable, "-S", "-B", _ZYGOTE, f"populora-sandbox:{os.getpid()}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if debug else subprocess.DEVNULL,
            env=env,
            cwd="/",
            start_new_session=True,
            close_fds=True,
            bufsize=0,
        )
        blob = marshal.dumps(cfg)
        try:
            assert proc.stdin is not None
            proc.stdin.write(len(blob).to_bytes(4, "big") + blob)
        except OSError:
            pass  # it died at once: _await_ready reports it
        return variant, slot, fallback_tmp, proc, time.monotonic() + self.params.startup_timeout_s

    def _await_ready(
        self, variant: int, slot: int, fallback_tmp: str, proc: subprocess.Popen, deadline: float
    ) -> _Worker:
        worker = _Worker(variant, slot, self._uid(variant, slot), proc, {}, fallback_tmp, self.params.hang_grace_s)
        sel = selectors.DefaultSelector()
        sel.register(worker.fd, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    self._stop(worker)
                    raise SandboxStartError("sandbox zygote did not start in time")
                reply = self._read_reply(worker)
                if reply is False:
                    continue
                if reply is None or not reply.get("ready"):
                    self._stop(worker)
                    why = reply.get("error") if isinstance(reply, dict) else "exited at start"
                    raise SandboxStartError(f"sandbox zygote failed to start: {why}")
                worker.isolation = reply["isolation"]
                if self.params.syscall_filter and not worker.isolation.get("syscall_filter"):
                    self._stop(worker)
                    raise SyscallFilterUnavailable(
                        "the sandbox cannot install its system-call filter (seccomp): "
                        f"{worker.isolation.get('syscall_filter_reason')}. Programs would reach unshare, mount, "
                        "ptrace, bpf and the rest of the kernel's surface; install libseccomp (Debian: libseccomp2) "
                        "and the binding (pip install pyseccomp), or, on a kernel without seccomp, run without the "
                        "filter on purpose: executor params `syscall_filter: false`"
                    )
                if self.params.require_isolation and not worker.isolation.get("pid_namespace"):
                    self._stop(worker)
                    raise SandboxStartError(
                        "namespaces are required (require_isolation: true) but "
                        f"unavailable: {worker.isolation.get('fallback_reason')}"
                    )
                return worker
        finally:
            sel.close()

    def _replace(self, worker: _Worker) -> _Worker:
        self._stop(worker)
        workers = self._pool.get(worker.variant, [])
        try:
            fresh = self._await_ready(*self._spawn(worker.variant, worker.slot))
        except SandboxStartError:
            fresh = None
        if fresh is None:  # try once more; a second failure is a broken setup, not a program
            fresh = self._await_ready(*self._spawn(worker.variant, worker.slot))
        for i, w in enumerate(workers):
            if w is worker:
                workers[i] = fresh
        return fresh

    def _stop(self, worker: _Worker) -> None:
        proc = worker.proc
        if proc.poll() is None and not worker.isolation.get("pid_namespace"):
            # Fallback: SIGTERM lets the zygote kill what its programs left (no namespace does it).
            for sig in (signal.SIGTERM, signal.SIGCONT):
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # Z's session; I dies with Z (death signal)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(worker.fallback_tmp, ignore_errors=True)

    def _cleanup_stale_fallback_dirs(self) -> None:
        """Fallback temp dirs of executors whose process is gone (killed before it could clean up)."""
        try:
            entries = list(self._tmp_root.glob(f"{_FALLBACK_PREFIX}*"))
        except OSError:
            return
        for entry in entries:
            pid = entry.name[len(_FALLBACK_PREFIX) :].split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(entry, ignore_errors=True)


#: Imported lazily by the standard library (str.encode, socket.getaddrinfo, datetime.strptime): they
#: could not be loaded once the zygote dropped root, so they are always pre-imported.
_SUPPORT_MODULES: tuple[str, ...] = (
    "encodings.idna",
    "encodings.ascii",
    "encodings.latin_1",
    "encodings.utf_16",
    "encodings.utf_32",
    "encodings.unicode_escape",
    "encodings.raw_unicode_escape",
    "encodings.cp1252",
)


def _python_library_dirs() -> list[str]:
    """Every Python library folder in reach (this interpreter's stdlib, lib-dynload and site-packages, the base
    interpreter's, the system's): covered in the programs' mount namespace, after the zygote imported from them."""
    import glob
    import sysconfig

    found = set()
    for scheme_paths in (sysconfig.get_paths(), sysconfig.get_paths(vars={"base": sys.base_prefix})):
        found |= {v for k, v in scheme_paths.items() if k in ("stdlib", "platstdlib", "purelib", "platlib")}
    found |= {x for x in sys.path if x.endswith(("site-packages", "dist-packages", "lib-dynload"))}
    for pattern in PYTHON_LIBRARY_GLOBS:
        found |= set(glob.glob(pattern))
    return sorted(os.path.realpath(d) for d in found if os.path.isdir(d))


def _child_pids(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _to_result(reply: dict[str, Any]) -> ExecResult:
    status = reply.get("status")
    if status not in _STATUSES:
        return ExecResult("killed", error=f"SandboxError: bad status {status!r}")
    return ExecResult(
        status=status,
        value=reply.get("value"),
        stdout=reply.get("stdout") or "",
        error=reply.get("error"),
        wall_s=float(reply.get("wall_s") or 0.0),
    )
