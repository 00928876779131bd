"""Settings of the ``sandbox`` executor (pydantic, no heavy imports)."""

from __future__ import annotations

from pydantic import Field

from populora_core.api import Params

#: Pre-imported modules: what AZR-style programs use. They are imported in the zygote before it drops
#: root (the interpreter lives under /root, mode 0700), so this list doubles as the import allowlist.
DEFAULT_MODULES: tuple[str, ...] = (
    "abc",
    "array",
    "base64",
    "binascii",
    "bisect",
    "calendar",
    "cmath",
    "collections",
    "collections.abc",
    "copy",
    "dataclasses",
    "datetime",
    "_strptime",
    "decimal",
    "enum",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "hmac",
    "io",
    "itertools",
    "json",
    "math",
    "numbers",
    "operator",
    "queue",
    "random",
    "re",
    "secrets",
    "statistics",
    "string",
    "struct",
    "textwrap",
    "threading",
    "time",
    "typing",
    "unicodedata",
    "zlib",
)


class SandboxParams(Params):
    """Limits and isolation of the process-per-program sandbox (see plugins/populora_sandbox/README.md)."""

    timeout_s: float = Field(10.0, gt=0, description="wall-clock limit per program (AZR: 10 s)")
    memory_mb: int = Field(1024, ge=32, description="address-space limit per program (RLIMIT_AS)")
    max_output_bytes: int = Field(1_048_576, ge=1024, description="cap on captured stdout and on the value's repr")
    workers: int = Field(0, ge=0, le=64, description="zygotes per hash variant; 0 = one per CPU core")
    modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_MODULES), description="pre-imported modules = the import allowlist"
    )
    extra_modules: list[str] = Field(default_factory=list, description="added to `modules` (e.g. numpy)")
    max_processes: int = Field(32, ge=1, description="RLIMIT_NPROC of the program's uid (threads count)")
    max_open_files: int = Field(64, ge=8, description="RLIMIT_NOFILE")
    max_file_mb: int = Field(16, ge=1, description="RLIMIT_FSIZE: largest file a program may write")
    tmpfs_mb: int = Field(64, ge=1, description="size of each private tmpfs (/tmp, /dev/shm, ...)")
    tmpfs_inodes: int = Field(4096, ge=64, description="files per private tmpfs (kernel memory bound)")
    tmp_dirs: list[str] = Field(
        default_factory=lambda: ["/tmp", "/var/tmp", "/dev/shm"],
        description="world-writable dirs replaced by a private tmpfs",
    )
    visible_top_level: list[str] = Field(
        default_factory=lambda: [
            "/usr",
            "/bin",
            "/sbin",
            "/lib",
            "/lib32",
            "/lib64",
            "/libx32",
            "/etc",
            "/dev",
            "/proc",
            "/tmp",
            "/var",
        ],
        description="top-level entries programs may see; every other one (/root, /home, /work, /run, "
        "/mnt, /sys: the host's network interfaces, ...) is covered by an empty read-only tmpfs (files by /dev/null); "
        "/proc is the namespace's own, emptied for programs",
    )
    hide_paths: list[str] = Field(
        default_factory=list, description="more paths to hide; the trainer's cwd and home are added"
    )
    namespaces: bool = Field(True, description="network/PID/mount namespaces; false forces the fallback")
    require_isolation: bool = Field(False, description="fail at start instead of falling back")
    syscall_filter: bool = Field(
        True,
        description="seccomp filter on every program (no namespaces, mounts, ptrace, bpf, keyrings, perf, modules, "
        "kexec, userfaultfd, io_uring, personality, executable memory); the sandbox refuses to start where it cannot "
        "be installed; false runs without it on purpose (a kernel without seccomp)",
    )
    uid_base: int = Field(1_000_000, ge=1000, description="first uid of the unprivileged program uids")
    uid_span: int = Field(16_000_000, ge=256, description="uids available above uid_base")
    seed: int = Field(0, description="derives each hash variant's PYTHONHASHSEED")
    max_hash_variants: int = Field(4, ge=1, le=16, description="distinct ExecJob.hash_variant values")
    hang_grace_s: float = Field(10.0, gt=0, description="extra wait before a silent zygote is replaced")
    startup_timeout_s: float = Field(60.0, gt=0, description="how long a zygote may take to start")
