"""Sandbox zygote: a small root process that forks one isolated child per program.

Run as a *script* (``python -S _zygote.py``, config as the first stdin message) with a scrubbed
environment, never imported by the trainer: it must stay small (fork cost grows with the memory it
touched) and must not load pydantic, torch or the toolkit. It talks to the parent over its
stdin/stdout pipes, moved at start to fds 3 (jobs in) and 4 (results out), both framed as a 4-byte
big-endian length plus a JSON object.

Process layout with namespaces (the default as root)::

    parent (trainer) --- Z (this script, host PID namespace; pre-imports, unshare NET|PID|NS)
                             \\-- I (PID 1 of the new namespace: mounts, serves jobs, reaps)
                                   \\-- one child per program (setuid to this zygote's own uid)

Z dies with the parent (PR_SET_PDEATHSIG), I dies with Z, and when I (the namespace's init) dies
the kernel kills every process left in the namespace. After each program I sends SIGKILL to every
process of the namespace (``kill(-1)`` is namespace-scoped), reaps them and wipes the private tmpfs.
Without namespaces (not permitted, or switched off) Z serves the jobs itself and cleans up by
killing every process of the slot uid and every orphan it adopted as a child subreaper.
"""

from __future__ import annotations

# --- 1. everything the programs may import is imported first (it is also the import allowlist) -----
# The config is the first message on stdin, marshal-encoded: marshal and posix are built in, so
# reading it imports nothing that programs would then be allowed to import.
import marshal
import posix
import sys


def _read_config() -> dict:
    head = b""
    while len(head) < 4:
        head += posix.read(0, 4 - len(head)) or sys.exit(1)
    size, body = int.from_bytes(head, "big"), b""
    while len(body) < size:
        body += posix.read(0, size - len(body)) or sys.exit(1)
    return marshal.loads(body)


_CFG = _read_config()
sys.path[:] = list(_CFG["sys_path"])
_IMPORT_FAILURES: dict[str, str] = {}
for _name in _CFG["modules"]:
    try:
        __import__(_name)
    except Exception as _exc:  # a missing optional module (numpy) must not stop the sandbox
        _IMPORT_FAILURES[_name] = f"{type(_exc).__name__}: {_exc}"
# Modules imported so far are what programs may import (plus what the interpreter loaded at start).
_ALLOWED_MODULES = frozenset(sys.modules)

# --- 2. infrastructure, imported after the allowlist snapshot (deleted from sys.modules in children)
import ctypes  # noqa: E402
import errno  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import select  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402


def _import_binding(names: list) -> tuple:
    """The first seccomp binding that imports (libseccomp's own ``seccomp``, else PyPI's ``pyseccomp``, both over
    the system libseccomp), imported here in Z: after the mounts its files may be hidden. (module, why not)."""
    why = "no seccomp binding named"
    for name in names:
        try:
            return __import__(name), None
        except Exception as exc:
            why = f"{name}: {type(exc).__name__}: {exc}"
    return None, why


_SECCOMP, _SECCOMP_MISSING = _import_binding(list(_CFG["seccomp_bindings"])) if _CFG["syscall_filter"] else (None, None)
_LIBC = ctypes.CDLL(None, use_errno=True)
# libc's fork called with the GIL held (PyDLL). os.fork() would run CPython's at-fork machinery in
# every child: threading's and random's after-fork hooks alone cost ~110 copy-on-write page faults,
# i.e. several ms per program here. The zygote never starts threads and holds no lock while it
# forks, so the interpreter state a child inherits is consistent without those hooks.
_RAW_FORK = ctypes.PyDLL(None, use_errno=True).fork
_RAW_FORK.restype = ctypes.c_int
_RAW_FORK.argtypes = []
_LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_LIBC.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
PROT_EXEC = 4
#: Refused with EPERM: what a program that computes has no use for and container escapes start from (namespaces,
#: mounts, tracing, eBPF, kernel keyrings, perf, modules, kexec, userfaultfd, io_uring, personality) and their kin.
DENIED_SYSCALLS = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "ptrace",
    "bpf",
    "keyctl",
    "perf_event_open",
    "init_module",
    "kexec_load",
    "userfaultfd",
    "io_uring_setup",
    "personality",
    # kin
    "add_key",
    "request_key",
    "finit_module",
    "delete_module",
    "kexec_file_load",
    "io_uring_enter",
    "io_uring_register",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "chroot",
    "open_by_handle_at",
    "name_to_handle_at",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "syslog",
    "iopl",
    "ioperm",
    "sethostname",
    "setdomainname",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "fanotify_init",
    "lookup_dcookie",
    "vhangup",
    "uselib",
)
#: clone() flags that create namespaces (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET): such a clone
#: is refused (EPERM); clone3 passes its flags in memory a filter cannot read, so it answers ENOSYS and libc falls
#: back to clone.
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_MEMORY_CHECK_S = 0.02  # how often a running program's processes are weighed together
JOB_FD, RESULT_FD = 3, 4  # the parent's pipes in Z/I
CHILD_RESULT_FD = 3  # the per-program result pipe in a child (the parent's pipes are closed there)
WORKDIR_NAME = "job"


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg: int = 0) -> None:
    _check(_LIBC.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _LIBC.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _install_syscall_filter(cfg: dict) -> dict:
    """``prctl(PR_SET_NO_NEW_PRIVS)``, then a seccomp filter (default allow) that refuses :data:`DENIED_SYSCALLS`,
    clone with namespace flags, clone3, and mapping memory executable (``mmap``/``mprotect`` with PROT_EXEC:
    no native code can be loaded, whatever loader a program finds). Installed once in the process that forks the
    programs (after its own mounts), inherited by every program and everything it starts. Returns what
    ``isolation`` reports about it."""
    info: dict = {"syscall_filter": False, "syscall_filter_reason": None, "syscall_filter_binding": None}
    if not cfg["syscall_filter"]:
        info["syscall_filter_reason"] = "switched off (syscall_filter: false)"
        return info
    sc = _SECCOMP
    if sc is None:
        info["syscall_filter_reason"] = f"no seccomp binding could be imported ({_SECCOMP_MISSING})"
        return info
    info["syscall_filter_binding"] = f"{sc.__name__} {getattr(sc, '__version__', '?')}"
    try:
        filt = sc.SyscallFilter(sc.ALLOW)
        eperm = sc.ERRNO(errno.EPERM)
        skipped = []
        for name in DENIED_SYSCALLS:
            try:
                filt.add_rule(eperm, name)
            except Exception:  # a call this architecture or libseccomp does not know: nothing to deny
                skipped.append(name)
        for flag in CLONE_NAMESPACE_FLAGS:
            filt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for name in ("mmap", "mprotect", "pkey_mprotect"):
            filt.add_rule(eperm, name, sc.Arg(2, sc.MASKED_EQ, PROT_EXEC, PROT_EXEC))
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        filt.load()
    except Exception as exc:  # a kernel without seccomp (EINVAL), a broken libseccomp
        info["syscall_filter_reason"] = f"loading the filter failed: {_describe(exc)}"
        return info
    info.update(syscall_filter=True, syscall_filter_skipped=skipped)
    return info


# --- framing ----------------------------------------------------------------------------------------


def _read_exact(fd: int, size: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < size:
        try:
            chunk = os.read(fd, size - len(buf))
        except InterruptedError:
            continue
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(fd: int) -> dict | None:
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def _send(fd: int, obj: dict) -> None:
    data = json.dumps(obj).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


# --- the program child --------------------------------------------------------------------------------


class _OutputTooLarge(BaseException):
    """Raised inside the child when the program prints more than the cap (BaseException: hard to swallow)."""


class _CappedWriter:
    """sys.stdout replacement: keeps the text, counts UTF-8 bytes, aborts the program past the cap."""

    def __init__(self, cap: int) -> None:
        self.cap, self.size, self.exceeded = cap, 0, False
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.size += len(text.encode("utf-8", "surrogatepass"))
        self.parts.append(text)
        if self.size > self.cap:
            self.exceeded = True
            raise _OutputTooLarge()
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        out = "".join(self.parts)
        return out[-self.cap :] if len(out) > self.cap else out


class _NullWriter(_CappedWriter):
    def write(self, text: str) -> int:
        return len(text)


def _child(job: dict, cfg: dict, workdir: str, uid: int, in_namespace: bool) -> None:
    """Runs in the forked child; never returns (os._exit)."""
    os.setsid()
    if not in_namespace:  # in a PID namespace the kernel kills us with the namespace's init anyway
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.dup2(_PIPE_W, CHILD_RESULT_FD)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(CHILD_RESULT_FD + 1, 1 << 20)
    timeout = float(job["timeout_s"])
    cpu = int(timeout) + 1
    mem = int(job["memory_mb"]) * 1024 * 1024
    limits = [
        (resource.RLIMIT_AS, mem),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, int(cfg["max_file_mb"]) * 1024 * 1024),
        (resource.RLIMIT_NOFILE, int(cfg["max_open_files"])),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, int(cfg["max_processes"])),
    ]
    for which, limit in limits:
        hard = limit + 1 if which == resource.RLIMIT_CPU else limit
        resource.setrlimit(which, (limit, hard))
    os.chdir(workdir)
    os.umask(0o077)
    if os.getuid() == 0 and uid != 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    # The environment was scrubbed once in the zygote (_restrict_imports). Without the at-fork hooks
    # `random` keeps the zygote's state: reseed it from the OS when the program mentions it (a
    # program that reaches it another way shares its zygote's stream; hash variants still differ).
    if "random" in job["code"] or "random" in (job.get("expr") or ""):
        rnd = sys.modules.get("random")
        if rnd is not None:
            rnd.seed()
    dumps, write, exit_ = json.dumps, os.write, os._exit
    out = _CappedWriter(int(job["max_output_bytes"]))
    status: str = "ok"
    value: str | None = None
    error: str | None = None
    sys.stdout = out  # the module allowlist was applied once in the zygote (_restrict_imports)
    try:
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(compile(job["code"], "<program>", "exec"), namespace)
        if job.get("expr") is not None:
            value = repr(eval(compile(job["expr"], "<expr>", "eval"), namespace))
    except _OutputTooLarge:
        status = "output_too_large"
    except MemoryError as exc:
        status, error = "memory", f"MemoryError: {exc}"
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: the program's doing, an error
        status, error = "error", _describe(exc)
    if out.exceeded:
        status = "output_too_large"
    try:
        stdout = out.text()
        payload = {"status": status, "value": value, "stdout": stdout, "error": error}
        data = dumps(payload).encode()
    except MemoryError:
        data = b'{"status": "memory", "error": "MemoryError: while reporting the result"}'
    except BaseException as exc:
        data = dumps({"status": "error", "error": _describe(exc)}).encode()
    try:
        view = memoryview(data)
        while view:
            view = view[write(CHILD_RESULT_FD, view) :]
    except BaseException:
        exit_(71)
    exit_(0)


def _restrict_imports(workdir: str) -> None:
    """Done once in the zygote, inherited by every child: only allowlisted modules, nothing from disk,
    a minimal environment (done here, not per child: each page a child writes costs a page fault).

    The zygote keeps working through the module objects it already holds; it imports nothing later.
    """
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
    for name in [n for n in sys.modules if n not in _ALLOWED_MODULES]:
        del sys.modules[name]
    sys.argv[:] = ["<program>"]  # the worker's command line (paths, the trainer's pid) is none of its business
    sys.orig_argv[:] = ["python"]
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", "") == "BuiltinImporter"]
    sys.path[:] = []
    sys.path_hooks[:] = []
    sys.path_importer_cache.clear()
    sys.stdout = sys.__stdout__ = _NullWriter(0)  # type: ignore[misc, assignment]
    sys.stderr = sys.__stderr__ = _NullWriter(0)  # type: ignore[misc, assignment]


def _describe(exc: BaseException) -> str:
    try:
        message = str(exc)
    except BaseException:
        message = "<unprintable>"
    return f"{type(exc).__name__}: {message}"


# --- the serving loop (in I, or in Z without namespaces) --------------------------------------------

_PIPE_W = -1
_PROC_FD = -1  # I's handle on the namespace's /proc, which programs do not see


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class Server:
    def __init__(self, cfg: dict, isolation: dict) -> None:
        self.cfg, self.isolation = cfg, isolation
        self.uid = int(cfg["uid"]) if os.getuid() == 0 else os.getuid()
        self.in_namespace = isolation["pid_namespace"]
        self.tmp_dirs = list(cfg["tmp_dirs"]) if isolation["mount_namespace"] else []
        self.base = "/tmp" if isolation["mount_namespace"] else cfg["fallback_tmp"]
        if not isolation["mount_namespace"]:
            os.makedirs(self.base, mode=0o711, exist_ok=True)
            os.chmod(self.base, 0o711)  # programs (another uid) may only reach their own work dir inside
        self.workdir = os.path.join(self.base, WORKDIR_NAME)
        self._clean_marks: list[int] | None = None  # free inodes of each tmpfs when last known clean
        self.current_pid = 0
        self._workdir_stamp: tuple[int, int, int] = (0, 0, 0)

    def serve(self) -> None:
        _restrict_imports(self.workdir)
        gc.collect()
        gc.freeze()  # keep the collector off the inherited objects: fewer copy-on-write faults per fork
        while True:
            job = _recv(JOB_FD)
            if job is None or job.get("op") == "exit":
                return
            try:
                result = self.run(job)
            except Exception as exc:  # an internal failure: report it, keep serving
                result = {
                    "status": "killed",
                    "error": f"SandboxError: {_describe(exc)}",
                    "trace": traceback.format_exc(limit=4),
                }
            _send(RESULT_FD, result)

    def _tmpfs_marks(self) -> list[int] | None:
        """Free-inode counts of the private tmpfs mounts: unchanged means no program left anything."""
        if not self.tmp_dirs:
            return None
        try:
            return [os.statvfs(d).f_ffree for d in self.tmp_dirs]
        except OSError:
            return None

    def _prepare_workdir(self) -> None:
        if self._clean_marks is not None and self._tmpfs_marks() == self._clean_marks:
            try:  # nothing was created since the last wipe: reuse the empty work dir, unless it was
                # touched at all (mode, xattrs, entries: ctime/mtime move), so no program sees another's trace
                st = os.lstat(self.workdir)
                if (st.st_ino, st.st_ctime_ns, st.st_mtime_ns) == self._workdir_stamp:
                    return
            except OSError:
                pass
        self._wipe()
        os.mkdir(self.workdir, 0o700)
        os.chown(self.workdir, self.uid, self.uid)
        st = os.lstat(self.workdir)
        self._workdir_stamp = (st.st_ino, st.st_ctime_ns, st.st_mtime_ns)
        self._clean_marks = self._tmpfs_marks()

    def run(self, job: dict) -> dict:
        global _PIPE_W
        self._prepare_workdir()
        start = time.monotonic()
        deadline = start + float(job["timeout_s"])
        cap = int(job["max_output_bytes"])
        r, w = os.pipe()
        _PIPE_W = w
        pid = _RAW_FORK()
        if pid < 0:
            err = ctypes.get_errno()
            os.close(r)
            os.close(w)
            raise OSError(err, f"fork: {os.strerror(err)}")
        if pid == 0:
            try:
                if not self.in_namespace:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the zygote's cleanup handler
                # Python's own SIGINT handling even when the zygote inherited SIGINT ignored (a background
                # job, a parent that ignores it): _thread.interrupt_main, the harness timer, relies on it.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                os.close(r)
                _child(job, self.cfg, self.workdir, self.uid, self.in_namespace)
            finally:
                os._exit(70)
        os.close(w)
        self.current_pid = pid
        status_code: int | None = None
        timed_out = too_big = False
        data = bytearray()
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        poller.register(r, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        pipe_open = True
        over_memory = False
        next_memory_check = start + _MEMORY_CHECK_S
        mem_budget_pages = int(job["memory_mb"]) * 1024 * 1024 // _PAGE
        try:
            while status_code is None or pipe_open:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                events = poller.poll(min(remaining, _MEMORY_CHECK_S) * 1000)
                if self.in_namespace and time.monotonic() >= next_memory_check:
                    next_memory_check = time.monotonic() + _MEMORY_CHECK_S
                    if self._namespace_rss_pages() > mem_budget_pages:
                        over_memory = True  # RLIMIT_AS is per process: bound the processes together
                        break
                for fd, _ev in events:
                    if fd == r:
                        chunk = os.read(r, 1 << 16)
                        if not chunk:
                            pipe_open = False
                            poller.unregister(r)
                        else:
                            data += chunk
                            if len(data) > 2 * cap + 65536:
                                too_big = True
                    elif fd == pidfd and status_code is None:
                        status_code = os.waitpid(pid, 0)[1]
                        poller.unregister(pidfd)
                if too_big:
                    break
                if status_code is not None and pipe_open:
                    # the child is gone; a descendant may still hold the pipe: take what is there
                    os.set_blocking(r, False)
                    try:
                        while chunk := os.read(r, 1 << 16):
                            data += chunk
                    except BlockingIOError:
                        pass
                    break
        finally:
            wall = time.monotonic() - start
            self._kill_all(pid)
            if status_code is None:
                status_code = self._reap_child(pid)
            self.current_pid = 0
            self._reap_all()
            os.close(r)
            os.close(pidfd)
            if self._clean_marks is None:
                self._wipe()  # fallback mode: no private tmpfs to check, wipe every time
        if over_memory:
            return {
                "status": "memory",
                "value": None,
                "stdout": "",
                "wall_s": wall,
                "error": f"MemoryError: the program's processes used more than {job['memory_mb']} MB together",
            }
        return self._classify(job, status_code, bytes(data), timed_out, too_big, wall)

    @staticmethod
    def _namespace_rss_pages() -> int:
        """Resident pages of every process in our PID namespace but us; 0 while the program is alone
        (one process is bounded by its own RLIMIT_AS already)."""
        pids = [p for p in os.listdir(_PROC_FD) if p.isdigit() and p != "1"]
        if len(pids) < 2:
            return 0
        total = 0
        for pid in pids:
            try:
                fd = os.open(f"{pid}/statm", os.O_RDONLY, dir_fd=_PROC_FD)
                try:
                    total += int(os.read(fd, 256).split()[1])
                finally:
                    os.close(fd)
            except (OSError, ValueError, IndexError):
                pass
        return total

    def shutdown(self) -> None:
        """Fallback mode only: kill every process we are responsible for, remove our files, exit."""
        try:
            if self.current_pid:
                self._kill_all(self.current_pid)
            else:
                self._kill_all(None)
            self._reap_all()
            shutil.rmtree(self.base, ignore_errors=True)
        finally:
            os._exit(0)

    def _classify(self, job: dict, code: int, data: bytes, timed_out: bool, too_big: bool, wall: float) -> dict:
        res: dict = {"status": "ok", "value": None, "stdout": "", "error": None, "wall_s": wall}
        if too_big:
            res.update(status="output_too_large", error="OutputTooLarge: result exceeds max_output_bytes")
            return res
        if timed_out:
            res.update(status="timeout", error=f"Timeout: exceeded {job['timeout_s']} s wall clock")
            return res
        parsed = None
        if data:
            try:
                parsed = json.loads(data)
            except ValueError:
                parsed = None
        if isinstance(parsed, dict) and parsed.get("status") in ("ok", "error", "memory", "output_too_large"):
            cap = int(job["max_output_bytes"])
            value, stdout, error = parsed.get("value"), parsed.get("stdout") or "", parsed.get("error")
            res["status"] = parsed["status"]
            res["stdout"] = stdout[-cap:] if isinstance(stdout, str) else ""
            res["error"] = error if isinstance(error, str) or error is None else str(error)
            if isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) > cap:
                res.update(status="output_too_large", error="OutputTooLarge: value repr exceeds max_output_bytes")
            elif res["status"] == "ok":
                res["value"] = value if isinstance(value, str) or value is None else None
            if res["status"] == "output_too_large" and not res["error"]:
                res["error"] = "OutputTooLarge: stdout exceeds max_output_bytes"
            return res
        if os.WIFSIGNALED(code):
            sig = os.WTERMSIG(code)
            if sig in (signal.SIGXCPU,):
                res.update(status="timeout", error="Timeout: CPU time limit exceeded")
            elif sig == signal.SIGXFSZ:
                res.update(status="killed", error="Killed: file size limit exceeded (SIGXFSZ)")
            else:
                res.update(status="killed", error=f"Killed: {_signal_name(sig)}")
        else:
            exit_code = os.WEXITSTATUS(code) if os.WIFEXITED(code) else -1
            res.update(status="error", error=f"ProcessExit: exited with code {exit_code} without a result")
        return res

    # --- cleanup -------------------------------------------------------------------------------

    def _kill_all(self, pid: int | None) -> None:
        if self.in_namespace:
            try:
                os.kill(-1, signal.SIGKILL)  # every process of this PID namespace except us (init)
            except ProcessLookupError:
                pass
            return
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)  # the program's session/process group
            except (ProcessLookupError, PermissionError):
                pass
        if os.getuid() == 0 and self.uid != 0:
            killer = os.fork()
            if killer == 0:
                try:
                    os.setgid(self.uid)
                    os.setuid(self.uid)
                    for _ in range(3):
                        try:
                            os.kill(-1, signal.SIGKILL)  # as the slot uid: exactly that uid's processes
                        except ProcessLookupError:
                            break
                finally:
                    os._exit(0)
            os.waitpid(killer, 0)
        for child in _children(os.getpid()):
            _kill_tree(child)

    def _reap_child(self, pid: int) -> int:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0

    def _reap_all(self) -> None:
        """Reap everything we adopted; loop while killed processes are still exiting."""
        deadline = time.monotonic() + 5.0
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                if time.monotonic() > deadline:
                    return
                if self.in_namespace:
                    try:
                        os.kill(-1, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                else:
                    for child in _children(os.getpid()):
                        _kill_tree(child)
                time.sleep(0.0005)

    def _wipe(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        for directory in self.tmp_dirs:
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                path = os.path.join(directory, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return kids


def _kill_tree(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGSTOP)
    except OSError:
        return
    for child in _children(pid):
        _kill_tree(child)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


# --- startup ---------------------------------------------------------------------------------------


def _setup_mounts(cfg: dict) -> None:
    """In I's fresh mount namespace: private propagation, own /proc, tmpfs over writable/secret dirs."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    size = int(cfg["tmpfs_mb"])
    for directory in cfg["tmp_dirs"]:
        if os.path.isdir(directory):
            _mount(
                "tmpfs",
                directory,
                "tmpfs",
                MS_NOSUID | MS_NODEV,
                f"size={size}m,nr_inodes={int(cfg['tmpfs_inodes'])},mode=1777",
            )
    visible = set(cfg["visible_top_level"]) | set(cfg["tmp_dirs"])
    hidden = [p for p in (os.path.join("/", e) for e in sorted(os.listdir("/"))) if p not in visible]
    for path in hidden + list(cfg["hide_paths"]):
        if os.path.islink(path) or not os.path.exists(path):
            continue  # a link into a visible dir (/bin -> usr/bin) or nothing to hide
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=755")
        elif os.path.isfile(path):
            _mount("/dev/null", path, None, MS_BIND)  # a file reads as empty
    # The namespace's own /proc still lists the mounts (the host's), every process's command line (the worker's)
    # and the network: I keeps a handle on it (to weigh a program's processes) and programs get an empty one.
    global _PROC_FD
    _PROC_FD = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    _mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=555")


def main() -> None:
    cfg = _CFG
    os.dup2(0, JOB_FD, inheritable=False)
    os.dup2(1, RESULT_FD, inheritable=False)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    expected_parent = int(cfg["parent_pid"])
    if cfg.get("pdeathsig", True):
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != expected_parent:
        os._exit(0)  # the parent died before we armed the death signal
    isolation: dict = {
        "root": os.getuid() == 0,
        "uid": None,
        "net_namespace": False,
        "pid_namespace": False,
        "mount_namespace": False,
        "fallback_reason": None,
        "import_failures": _IMPORT_FAILURES,
        "hash_seed": os.environ.get("PYTHONHASHSEED"),
    }
    if cfg["namespaces"]:
        if os.getuid() == 0:
            try:
                _check(_LIBC.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET), "unshare")
                isolation.update(net_namespace=True, pid_namespace=True, mount_namespace=True)
            except OSError as exc:
                isolation["fallback_reason"] = str(exc)
        else:
            isolation["fallback_reason"] = "not root: namespaces need CAP_SYS_ADMIN"
    else:
        isolation["fallback_reason"] = "namespaces switched off (namespaces: false)"
    if isolation["pid_namespace"]:
        init = os.fork()
        if init:
            # Z: wait for I, then exit with it; I dies with us through its own death signal.
            try:
                os.waitpid(init, 0)
            except ChildProcessError:
                pass
            os._exit(0)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # (a parent gone already shows as job-pipe EOF)
        try:
            _setup_mounts(cfg)
        except OSError as exc:
            _send(RESULT_FD, {"ready": False, "error": f"mount setup failed: {exc}"})
            os._exit(1)
    else:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    isolation.update(_install_syscall_filter(cfg))  # in the process that forks the programs, after its mounts
    isolation["proc_hidden"] = _PROC_FD >= 0
    isolation["uid"] = int(cfg["uid"]) if os.getuid() == 0 else os.getuid()
    server = Server(cfg, isolation)
    if not isolation["pid_namespace"]:
        # No namespace init to take everything down with us: on the parent's death (or a plain
        # SIGTERM) kill what the programs left and remove our temp dir before exiting.
        signal.signal(signal.SIGTERM, lambda *_: server.shutdown())
        if cfg.get("pdeathsig", True):
            _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != expected_parent:
            server.shutdown()
    _send(RESULT_FD, {"ready": True, "isolation": isolation, "pid": os.getpid()})
    server.serve()
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:
        try:
            _send(RESULT_FD, {"ready": False, "error": _describe(exc)})
        finally:
            os._exit(1)
