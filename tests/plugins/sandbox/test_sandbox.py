"""Sandbox executor: result semantics, the hostile-program corpus, worker replacement, no leaks.

Every hostile program must end with the right status, leave the test process (the "trainer") healthy
and leave no process of the sandbox uids and no file of theirs in the host's temp dirs.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from populora_core.api.components import ExecJob, ExecResult, Executor

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux-only")

SECRET = "populora-test-secret-8c1f0e"
HOST_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def _params(**kw):
    from populora_sandbox.params import SandboxParams

    base = {"workers": 2, "timeout_s": 5.0, "memory_mb": 512, "max_output_bytes": 65536}
    base.update(kw)
    return SandboxParams(**base)


@pytest.fixture(scope="module")
def executor():
    from populora_sandbox.executor import SandboxExecutor

    # the trainer's environment holds a secret and proxy settings; programs must see neither
    added = {"POPULORA_TEST_SECRET": SECRET, "HTTPS_PROXY": f"http://{SECRET}@proxy:3128"}
    added = {k: v for k, v in added.items() if k not in os.environ}
    os.environ.update(added)
    ex = SandboxExecutor(_params())
    yield ex
    ex.close()
    for key in added:
        os.environ.pop(key, None)


def _processes_of(uids) -> list[str]:
    """Host-wide: every live process whose real or effective uid is one of ``uids``."""
    uids = {str(u) for u in uids}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:"):
                real, eff = line.split()[1:3]
                if (real in uids or eff in uids) and "State:\tZ" not in status:
                    found.append(f"{entry}: {status.splitlines()[0]}")
                break
    return found


def _files_of(uids) -> list[str]:
    uids = set(uids)
    found = []
    for top in HOST_TMP_DIRS:
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                path = os.path.join(root, name)
                try:
                    if os.lstat(path).st_uid in uids:
                        found.append(path)
                except OSError:
                    pass
    return found


def _assert_clean(ex, wait_s: float = 3.0) -> None:
    deadline = time.monotonic() + wait_s
    while _processes_of(ex.uids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_of(ex.uids) == []
    assert _files_of(ex.uids) == []


def _healthy(ex) -> None:
    """The executor still answers a normal program correctly (so does this process)."""
    res = ex.run("def f(x):\n    return sorted(x)", "f([3, 1, 2])")
    assert res.status == "ok" and res.value == "[1, 2, 3]"


def _run(ex, code: str, expr: str | None = None, **kw) -> ExecResult:
    return ex.run_batch([ExecJob(textwrap.dedent(code), expr, **kw)])[0]


# --- contract and result semantics -------------------------------------------------------------------


def test_is_an_executor_and_registered(executor):
    from populora_core.plugin.manager import get_manager

    assert isinstance(executor, Executor)
    comp = get_manager().registry.get("executor", "sandbox")
    params = comp.parse_params({"timeout_s": 3, "workers": 1})
    assert params.timeout_s == 3 and comp.parse_params({}).timeout_s == 10.0
    with pytest.raises(Exception, match=r"unknown|extra"):
        comp.parse_params({"timeout": 3})
    made = comp.factory(params)
    try:
        assert isinstance(made, Executor) and made.run_batch([ExecJob("x = 2", "x * 21")])[0].value == "42"
    finally:
        made.close()
    assert "pid_namespace" in made.isolation  # still answers after close()


def test_isolation_in_effect(executor):
    iso = executor.isolation
    if os.getuid() == 0:
        assert iso["pid_namespace"] and iso["net_namespace"] and iso["mount_namespace"], iso
    res = _run(executor, "import os\nprint(os.getuid(), os.getgid(), os.getgroups())")
    uid = res.stdout.split()[0]
    assert res.status == "ok" and uid != "0" and int(uid) in executor.uids


def test_values_errors_and_stdout(executor):
    jobs = [
        ExecJob("def f(a, b):\n    return {'s': a + b}", "f(1, 2)"),
        ExecJob("print('hi'); print(3)"),
        ExecJob("def f(x):\n    return 1 / x", "f(0)"),
        ExecJob("def f(:\n  pass"),
        ExecJob("raise Exception('boom')"),
        ExecJob("import sys\nsys.exit(3)"),
        ExecJob("x = 1", "undefined_name"),
        ExecJob("import collections, re, math, heapq, itertools", "collections.Counter('aab')['a']"),
        ExecJob("import ctypes"),
    ]
    res = executor.run_batch(jobs)
    assert [r.status for r in res] == ["ok", "ok", "error", "error", "error", "error", "error", "ok", "error"]
    assert res[0].value == "{'s': 3}"
    assert res[1].stdout == "hi\n3\n" and res[1].value is None
    assert res[2].error == "ZeroDivisionError: division by zero"
    assert res[3].error.startswith("SyntaxError:")
    assert res[4].error == "Exception: boom"
    assert res[5].error == "SystemExit: 3"
    assert res[6].error.startswith("NameError:")
    assert res[7].value == "2"
    assert res[8].error.startswith("ModuleNotFoundError:")  # not pre-imported = not allowed
    assert all(r.wall_s > 0 for r in res)


def test_batch_keeps_order_and_programs_do_not_share_state(executor):
    jobs = [ExecJob(f"import math\nmath.pi = {i}\ndef f():\n    return math.pi", "f()") for i in range(40)]
    jobs += [ExecJob("import math", "math.pi")]
    res = executor.run_batch(jobs)
    assert [r.value for r in res[:40]] == [str(i) for i in range(40)]
    assert res[40].value == repr(3.141592653589793)  # no leak from the programs before
    assert executor.run_batch([]) == []


def test_batch_spreads_over_all_workers(executor):
    res = executor.run_batch([ExecJob("import os", "os.getuid()") for _ in range(12)])
    assert {r.status for r in res} == {"ok"}
    assert len({r.value for r in res}) == executor.workers == 2  # one uid per zygote, both used
    assert executor.cpu_seconds() > 0


def test_hash_variants_reorder_sets(executor):
    code = "def f():\n    return list({'alpha', 'beta', 'gamma', 'delta', 'eps', 'zeta', 'eta', 'theta'})"
    jobs = [ExecJob(code, "f()", hash_variant=v) for v in (0, 0, 1, 1)]
    a0, b0, a1, b1 = (r.value for r in executor.run_batch(jobs))
    assert a0 == b0 and a1 == b1  # same interpreter family: same order
    assert a0 != a1  # a different hash seed: a non-deterministic program is caught
    with pytest.raises(ValueError, match="hash_variant"):
        executor.run_batch([ExecJob("x = 1", hash_variant=99)])


def test_no_trace_between_programs(executor):
    """Whatever one program leaves in its work dir or the private tmpfs, the next ones do not see."""
    leave = "open('/tmp/note', 'w').write('x')\nopen('/dev/shm/note', 'w').write('x')\nopen('note', 'w').write('x')"
    # no new inode, same mode in the end: caught by the dir's ctime
    chmod_only = (
        "import os\nos.chmod('.', 0o755)\ntry:\n    os.setxattr('.', 'user.note', b'x')\n"
        "except OSError:\n    pass\nos.chmod('.', 0o700)"
    )
    look = (
        "import os\nprint(oct(os.stat('.').st_mode & 0o777), os.listdir('.'), os.listdir('/tmp'), "
        "os.listdir('/dev/shm'), os.listxattr('.'))"
    )
    res = executor.run_batch([ExecJob(leave), ExecJob(chmod_only)] + [ExecJob(look)] * 4)
    assert [r.status for r in res[:2]] == ["ok", "ok"], res
    if executor.isolation["mount_namespace"]:
        assert {r.stdout for r in res[2:]} == {"0o700 [] ['job'] [] []\n"}


def test_random_differs_between_programs(executor):
    res = executor.run_batch([ExecJob("import random", "random.random()") for _ in range(4)])
    assert len({r.value for r in res}) == 4


# --- the hostile corpus ---------------------------------------------------------------------------------


def test_fork_bomb_contained(executor):
    res = _run(
        executor,
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        timeout_s=1.0,
    )
    assert res.status == "timeout"
    _assert_clean(executor)
    _healthy(executor)


def test_double_forked_daemon_is_killed(executor):
    res = _run(
        executor,
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1000)
            os._exit(0)
        os.wait()
        """,
        "'parent done'",
    )
    assert res.status == "ok" and res.value == "'parent done'"
    _assert_clean(executor)


def test_memory_bombs(executor):
    big = _run(executor, "x = bytearray(8 * 1024 ** 3)", memory_mb=256)
    grow = _run(executor, "xs = []\nwhile True:\n    xs.append(' ' * 10_000_000)", memory_mb=256)
    assert big.status == "memory" and big.error.startswith("MemoryError")
    assert grow.status == "memory"
    _assert_clean(executor)
    _healthy(executor)


def test_memory_bomb_spread_over_processes(executor):
    """RLIMIT_AS is per process: eight children of 100 MB each must still count as 800 MB."""
    res = _run(
        executor,
        """
        import os, time
        for _ in range(8):
            if os.fork() == 0:
                block = b'x' * (100 * 1024 * 1024)
                time.sleep(30)
                os._exit(0)
        time.sleep(30)
        """,
        memory_mb=256,
        timeout_s=20.0,
    )
    if executor.isolation["pid_namespace"]:
        assert res.status == "memory" and "together" in res.error, res
    _assert_clean(executor)
    _healthy(executor)


def test_infinite_loop_and_sleep_time_out(executor):
    res = executor.run_batch(
        [ExecJob("while True:\n    pass", timeout_s=1.0), ExecJob("import time\ntime.sleep(100)", timeout_s=1.0)]
    )
    assert [r.status for r in res] == ["timeout", "timeout"]
    assert all(r.wall_s >= 1.0 for r in res)
    _assert_clean(executor)


def test_deep_recursion_is_an_error(executor):
    res = _run(executor, "def r(n):\n    return r(n + 1)", "r(0)")
    assert res.status == "error" and res.error.startswith("RecursionError")


def test_setrecursionlimit_abuse_contained(executor):
    res = _run(
        executor,
        """
        import sys
        sys.setrecursionlimit(10 ** 8)
        def r(n):
            return [r(n + 1)]
        r(0)
        """,
        timeout_s=5.0,
        memory_mb=256,
    )
    assert res.status in ("memory", "killed", "error", "timeout"), res
    assert res.status != "ok"
    nested = _run(
        executor,
        """
        import sys
        sys.setrecursionlimit(10 ** 8)
        x = []
        for _ in range(300_000):
            x = [x]
        """,
        "x",
        memory_mb=256,
        timeout_s=20.0,
    )  # repr of a 300k-deep list recurses in C
    assert nested.status in ("memory", "killed", "error"), nested
    _assert_clean(executor)
    _healthy(executor)


def test_huge_output(executor):
    loud = _run(executor, "while True:\n    print('x' * 1000)")
    big_value = _run(executor, "pass", "'x' * (10 ** 7)")
    assert loud.status == "output_too_large" and len(loud.stdout) <= 65536
    assert big_value.status == "output_too_large" and big_value.value is None
    swallowed = _run(
        executor,
        """
        try:
            while True:
                print('y' * 1000)
        except BaseException:
            pass
        """,
        "'fine'",
    )
    assert swallowed.status == "output_too_large"  # catching the abort does not help
    _healthy(executor)


def test_writing_outside_the_work_dir(executor, tmp_path):
    marker = f"populora_escape_{os.getpid()}"
    res = _run(
        executor,
        f"""
        import os
        results = {{}}
        for path in ['/etc/{marker}', '/{marker}', '/usr/{marker}', '/root/{marker}',
                     '/work/{marker}', '{tmp_path}/{marker}', '/tmp/{marker}', '/dev/shm/{marker}']:
            try:
                with open(path, 'w') as fh:
                    fh.write('x')
                results[path] = 'written'
            except OSError as exc:
                results[path] = type(exc).__name__
        with open('inside.txt', 'w') as fh:
            fh.write('ok')
        print(results)
        print(os.getcwd(), os.listdir('.'))
        """,
    )
    assert res.status == "ok", res
    written = ast.literal_eval(res.stdout.splitlines()[0])
    outside_tmp = {k: v for k, v in written.items() if not k.startswith(("/tmp/", "/dev/shm/"))}
    assert all(v != "written" for v in outside_tmp.values()), written
    for path in written:  # nothing reached the host, not even the private /tmp writes
        assert not os.path.exists(path), path
    assert "inside.txt" in res.stdout
    _assert_clean(executor)


def test_inode_flood_is_bounded(executor):
    res = _run(
        executor,
        """
        made = 0
        try:
            for i in range(100_000):
                open(f'f{i}', 'w').close()
                made += 1
        except OSError as exc:
            print(type(exc).__name__, made)
        """,
    )
    assert res.status == "ok" and res.stdout.startswith("OSError"), res  # ENOSPC: out of inodes
    if executor.isolation["mount_namespace"]:
        assert int(res.stdout.split()[-1]) < 4096
    _assert_clean(executor)
    _healthy(executor)


def test_big_file_stopped_by_size_limit(executor):
    res = _run(executor, "with open('big', 'wb') as fh:\n    fh.write(b'0' * (64 * 1024 * 1024))")
    assert res.status in ("killed", "error"), res  # SIGXFSZ, or ENOSPC on the private tmpfs
    _assert_clean(executor)


def test_reading_the_parents_environment_and_files(executor, tmp_path):
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    repo_file = Path(__file__).resolve()
    res = _run(
        executor,
        f"""
        import os
        seen = [str(dict(os.environ))]
        for pid in os.listdir('/proc'):
            if pid.isdigit():
                for name in ('environ', 'cmdline'):
                    try:
                        with open(f'/proc/{{pid}}/{{name}}', 'rb') as fh:
                            seen.append(fh.read().decode('latin-1'))
                    except OSError as exc:
                        seen.append(type(exc).__name__)
        for path in ['{secret_file}', '{repo_file}', '/root/.bashrc', '/etc/shadow']:
            try:
                with open(path) as fh:
                    seen.append(fh.read())
            except OSError as exc:
                seen.append(type(exc).__name__)
        print(len(os.listdir('/proc')), os.getppid())
        print(repr(seen)[:50000])
        """,
    )
    assert res.status == "ok", res
    assert SECRET not in res.stdout and "PROXY" not in res.stdout.upper()
    assert ast.literal_eval(res.stdout.splitlines()[1])[0] == str(
        {"PATH": "/usr/bin:/bin", "HOME": "/tmp/job", "TMPDIR": "/tmp/job", "LANG": "C.UTF-8"}
    )
    assert "test_sandbox" not in res.stdout  # this file (the trainer's code) is hidden
    if executor.isolation["pid_namespace"]:
        assert res.stdout.split()[1] == "1"  # the parent it sees is the namespace's init


def test_no_network(tmp_path):
    from populora_sandbox.executor import SandboxExecutor

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    with SandboxExecutor(_params(workers=1, extra_modules=["socket"])) as ex:
        res = _run(
            ex,
            f"""
            import socket
            out = []
            for host in ['127.0.0.1', '1.1.1.1', '10.0.0.1']:
                s = socket.socket()
                s.settimeout(1)
                try:
                    s.connect((host, {port}))
                    out.append('connected')
                except OSError as exc:
                    out.append(type(exc).__name__)
            try:
                socket.getaddrinfo('pypi.org', 443)
                out.append('resolved')
            except OSError as exc:
                out.append(type(exc).__name__)
            print(out)
            """,
        )
        assert res.status == "ok", res
        assert "connected" not in res.stdout and "resolved" not in res.stdout, res.stdout
        _assert_clean(ex)
    server.close()


def test_signalling_and_killing_the_parent(executor):
    me = os.getpid()
    res = _run(
        executor,
        f"""
        import os
        out = []
        for pid in [{me}, 1, os.getppid(), -1]:
            for sig in (9, 15, 19):  # SIGKILL, SIGTERM, SIGSTOP (the signal module is not allowed)
                try:
                    os.kill(pid, sig)
                    out.append('sent')
                except OSError as exc:
                    out.append(type(exc).__name__)
        print(out)
        """,
        "'survived'",
    )
    # kill(-1) reaches only the program itself: it dies, or everything else was refused
    assert res.status in ("ok", "killed"), res
    _healthy(executor)
    os.kill(me, 0)  # this process is alive
    _assert_clean(executor)


def test_os_exit_and_kill_self(executor):
    res = executor.run_batch(
        [
            ExecJob("import os\nos._exit(0)"),
            ExecJob("import os", "os._exit(7)"),
            ExecJob("import os\nos.kill(os.getpid(), 9)"),
            ExecJob("import os\nos.kill(os.getpid(), 11)"),
        ]
    )
    assert [r.status for r in res] == ["error", "error", "killed", "killed"]
    assert "without a result" in res[0].error and "code 7" in res[1].error
    assert "SIGKILL" in res[2].error and "SIGSEGV" in res[3].error
    _healthy(executor)


def test_spawning_a_subprocess(executor):
    res = executor.run_batch(
        [
            ExecJob("import subprocess"),
            ExecJob("import os\nif os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '1000'])", "'spawned'"),
            ExecJob("import os\npid = os.posix_spawn('/bin/sleep', ['sleep', '1000'], {})", "pid > 0"),
        ]
    )
    assert res[0].status == "error" and res[0].error.startswith("ModuleNotFoundError")
    assert res[1].status == "ok" and res[2].status == "ok" and res[2].value == "True"
    _assert_clean(executor)
    _healthy(executor)


def test_closing_and_redirecting_the_workers_pipes(executor):
    res = executor.run_batch(
        [
            ExecJob("import os\nos.closerange(0, 1024)", "'closed'"),
            ExecJob("import os\nfd = os.open('/dev/null', os.O_WRONLY)\nfor i in range(10):\n    os.dup2(fd, i)"),
            ExecJob("import os\nos.write(3, b'garbage that is not json')\nos.write(4, b'x')"),
            ExecJob("import sys, os\nsys.stdout = sys.__stderr__\nos.dup2(2, 1)\nprint('lost')"),
            ExecJob(
                "import os\nfor fd in range(3, 64):\n    try:\n        os.read(fd, 100)\n    except OSError:\n"
                "        pass"
            ),
        ]
    )
    for r in res:
        assert r.status in ("ok", "error"), r
    assert res[0].status == "error" and res[1].status == "error"  # the result had nowhere to go
    assert res[2].status == "error"  # garbage instead of a result
    _healthy(executor)
    _assert_clean(executor)


def test_threads_that_outlive_the_call(executor):
    res = _run(
        executor,
        """
        import threading, time, _thread
        threading.Thread(target=time.sleep, args=(1000,)).start()
        _thread.start_new_thread(time.sleep, (1000,))
        """,
        "threading.active_count()",
        timeout_s=3.0,
    )
    assert res.status == "ok" and res.value == "2"
    _assert_clean(executor)


def test_many_hostile_programs_in_one_batch(executor):
    """A mixed batch: each hostile program gets its own status; the honest ones are unaffected."""
    honest = ExecJob("def f(x):\n    return x * 2", "f(21)")
    jobs = [
        honest,
        ExecJob("while True:\n    pass", timeout_s=1.0),
        honest,
        ExecJob("x = bytearray(8 * 1024 ** 3)", memory_mb=256),
        honest,
        ExecJob("import os\nos._exit(1)"),
        honest,
    ]
    res = executor.run_batch(jobs)
    assert [r.status for r in res] == ["ok", "timeout", "ok", "memory", "ok", "error", "ok"]
    assert {r.value for r in res[::2]} == {"42"}


# --- the kernel's surface: the system-call filter, loadable extensions, what programs see (issue 51) -----------

# The zygote's own ctypes is in every program's process image (reachable through the frames above the program):
# programs get it here so that each system call below is asked of the kernel, and refused by the filter.
_IN_PROCESS_CTYPES = """
import sys
frame = sys._getframe()
while 'ctypes' not in frame.f_globals:
    frame = frame.f_back
ctypes = frame.f_globals['ctypes']
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]

def call(nr, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    return (ret, ctypes.get_errno())
"""
# x86_64 numbers: (name, number, args), each asked with arguments that would succeed or fail on their own merits
_DENIED_CALLS = [
    ("unshare(CLONE_NEWUSER)", 272, (0x10000000,)),
    ("unshare(CLONE_NEWNS)", 272, (0x00020000,)),
    ("unshare(CLONE_NEWNET)", 272, (0x40000000,)),
    ("clone(CLONE_NEWUSER|SIGCHLD)", 56, (0x10000000 | 17, 0, 0, 0, 0)),
    ("clone(CLONE_NEWPID|SIGCHLD)", 56, (0x20000000 | 17, 0, 0, 0, 0)),
    ("setns", 308, (0, 0x40000000)),
    ("mount", 165, (0, 0, 0, 0, 0)),
    ("umount2", 166, (0, 0)),
    ("pivot_root", 155, (0, 0)),
    ("ptrace(PTRACE_TRACEME)", 101, (0, 0, 0, 0)),
    ("bpf", 321, (0, 0, 0)),
    ("keyctl", 250, (0, 0, 0)),
    ("add_key", 248, (0, 0, 0, 0, 0)),
    ("perf_event_open", 298, (0, 0, -1, -1, 0)),
    ("init_module", 175, (0, 0, 0)),
    ("finit_module", 313, (-1, 0, 0)),
    ("kexec_load", 246, (0, 0, 0, 0)),
    ("userfaultfd", 323, (0,)),
    ("io_uring_setup", 425, (1, 0)),
    ("personality(PER_LINUX32)", 135, (0x0008,)),
    ("open_by_handle_at", 304, (-1, 0, 0)),
    ("process_vm_readv", 310, (1, 0, 0, 0, 0, 0)),
    ("fsopen", 430, (0, 0)),
    ("chroot", 161, (0,)),
]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="system call numbers of x86_64")
def test_every_denied_system_call_is_refused_with_eperm(executor):
    assert executor.isolation["syscall_filter"] is True, executor.isolation
    assert executor.isolation["syscall_filter_reason"] is None
    code = _IN_PROCESS_CTYPES + "\nout = {}\n"
    for name, nr, args in _DENIED_CALLS:
        code += f"out[{name!r}] = call({nr}, *{args!r})\n"
    code += "out['clone3'] = call(435, 0, 0)\nout['getpid'] = call(39)\nprint(repr(out))\n"
    res = _run(executor, code)
    assert res.status == "ok", res
    got = ast.literal_eval(res.stdout)
    assert {name: got[name] for name, _nr, _args in _DENIED_CALLS} == {name: (-1, 1) for name, *_ in _DENIED_CALLS}
    assert got["clone3"] == (-1, 38)  # ENOSYS: its flags are in memory a filter cannot read; libc falls back to clone
    assert got["getpid"][0] > 0 and got["getpid"][1] == 0  # everything else is still answered
    _healthy(executor)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="system call numbers of x86_64")
def test_the_issues_namespace_escape_chain_is_refused_at_each_step(executor):
    """The issue's program got ctypes, then unshare(CLONE_NEWUSER), CLONE_NEWNS and a tmpfs mount all succeeded."""
    res = _run(
        executor,
        _IN_PROCESS_CTYPES
        + """
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
steps = [call(272, 0x10000000), call(272, 0x00020000)]
ctypes.set_errno(0)
steps.append((libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno()))
ctypes.set_errno(0)
steps.append((libc.unshare(0x10000000 | 0x00020000), ctypes.get_errno()))
print(steps)
""",
    )
    assert res.status == "ok", res
    assert ast.literal_eval(res.stdout) == [(-1, 1)] * 4  # EPERM each time
    _assert_clean(executor)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="system call numbers of x86_64")
def test_no_native_code_can_be_mapped_and_other_abis_are_killed(executor):
    """mmap/mprotect with PROT_EXEC are refused, so no shared library can be loaded, whatever loader a program
    finds; a call through the x32 ABI (another syscall table) kills the program (libseccomp's bad-arch action)."""
    loaded = {line.split()[-1] for line in Path(f"/proc/{_init_pids(executor)[0]}/maps").read_text().splitlines()}
    unloaded = next(
        str(p)
        for p in sorted(Path("/usr/lib/x86_64-linux-gnu").glob("lib*.so.*"))
        if p.is_file() and str(p) not in loaded and os.path.realpath(p) not in loaded
    )
    res = executor.run_batch(
        [
            ExecJob(
                _IN_PROCESS_CTYPES
                + f"""
rwx = libc.mmap(None, 4096, 7, 0x22, -1, 0)
rwx_errno = ctypes.get_errno()
rw = libc.mmap(None, 4096, 3, 0x22, -1, 0)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
ctypes.set_errno(0)
protect = (libc.mprotect(rw, 4096, 5), ctypes.get_errno())
try:
    ctypes.CDLL({unloaded!r})
    opened = 'loaded'
except OSError as exc:
    opened = str(exc)
print(repr([rwx == 2 ** 64 - 1, rwx_errno, rw != 2 ** 64 - 1, protect, opened]))
"""
            ),
            ExecJob(_IN_PROCESS_CTYPES + "call(0x40000000 | 272, 0x10000000)"),
        ]
    )
    assert res[0].status == "ok", res[0]
    assert ast.literal_eval(res[0].stdout) == [
        True,
        1,
        True,
        (-1, 1),
        f"{unloaded}: failed to map segment from shared object",
    ]
    assert res[1].status == "killed" and res[1].error == "Killed: SIGSYS", res[1]
    _healthy(executor)


def test_the_issues_extension_loader_walk_around_fails(executor):
    """The issue: _ctypes loaded from the system Python's lib-dynload through ExtensionFileLoader, PathFinder put
    back, ctypes imported. Every Python library folder is hidden from programs, so there is nothing to load."""
    system = sorted(Path("/usr/lib").glob("python3*/lib-dynload/_ctypes.*.so"))
    base = sorted(Path(sys.base_prefix).glob("lib/python3*/lib-dynload/_sqlite3.*.so"))  # not imported by the zygote
    targets = [str(p) for p in (system + base)]
    if not targets:
        pytest.skip("no other Python's lib-dynload here")
    res = _run(
        executor,
        f"""
        import sys, _frozen_importlib_external as ext
        out = []
        for path in {targets!r}:
            name = path.rsplit('/', 1)[1].split('.')[0]
            loader = ext.ExtensionFileLoader(name, path)
            try:
                loader.create_module(ext.spec_from_file_location(name, path, loader=loader))
                out.append('loaded')
            except ImportError as exc:
                out.append(str(exc))
        sys.meta_path.append(ext.PathFinder)
        sys.path[:] = {sorted({str(Path(t).parents[1]) for t in targets})!r}
        try:
            import ctypes.util
            out.append('imported')
        except ImportError as exc:
            out.append(type(exc).__name__ + ': ' + str(exc))
        print(repr(out))
        """,
    )
    assert res.status == "ok", res
    assert ast.literal_eval(res.stdout) == [
        *[f"{t}: cannot open shared object file: No such file or directory" for t in targets],
        "ModuleNotFoundError: No module named 'ctypes'",
    ]


def test_no_view_of_the_mounts_the_interfaces_or_the_workers_command_line(executor):
    if not executor.isolation["mount_namespace"]:
        pytest.skip("needs the mount namespace (root)")
    res = _run(
        executor,
        """
        import os, sys
        out = {}
        for path in ['/proc/mounts', '/proc/self/mounts', '/proc/self/mountinfo', '/etc/mtab', '/proc/net/dev',
                     '/proc/self/cmdline', '/proc/1/cmdline', '/proc/self/environ', '/sys/class/net']:
            try:
                out[path] = os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read().decode()
            except OSError as exc:
                out[path] = type(exc).__name__
        out['/proc'] = os.listdir('/proc')
        out['/sys'] = os.listdir('/sys')
        out['argv'] = [sys.argv, sys.orig_argv]
        print(repr(out))
        """,
    )
    assert res.status == "ok", res
    seen = ast.literal_eval(res.stdout)
    assert seen == {
        **{path: "FileNotFoundError" for path in seen if path.startswith(("/proc/", "/etc/", "/sys/"))},
        "/proc": [],
        "/sys": [],
        "argv": [["<program>"], ["python"]],
    }
    assert executor.isolation["proc_hidden"] is True
    _healthy(executor)  # I still weighs a program's processes through its own handle on /proc
    bomb = _run(
        executor,
        "import os\nfor _ in range(6):\n    if os.fork() == 0:\n        x = bytearray(150 * 1024 * 1024)\n"
        "        import time\n        time.sleep(30)\nimport time\ntime.sleep(30)",
        memory_mb=400,
        timeout_s=10.0,
    )
    assert bomb.status == "memory", bomb


def test_without_the_filter_the_sandbox_refuses_to_start_unless_the_params_opt_out(monkeypatch):
    """A machine where the filter cannot be installed (here: no binding imports): the sandbox says why and refuses,
    naming the opt-out; with ``syscall_filter: false`` it runs, and says the filter is off."""
    from populora_sandbox import executor as module

    from populora_core.api.errors import UserError

    monkeypatch.setattr(module, "SECCOMP_BINDINGS", ("populora_no_such_binding",))
    with pytest.raises(module.SyscallFilterUnavailable) as refused:
        module.SandboxExecutor(_params(workers=1))
    assert isinstance(refused.value, UserError)
    assert str(refused.value).startswith(
        "the sandbox cannot install its system-call filter (seccomp): no seccomp binding could be imported "
        "(populora_no_such_binding: ModuleNotFoundError: No module named 'populora_no_such_binding')"
    )
    assert "executor params `syscall_filter: false`" in str(refused.value)
    with pytest.warns(UserWarning, match="without the system-call filter"):
        ex = module.SandboxExecutor(_params(workers=1, syscall_filter=False))
    with ex:
        assert ex.isolation["syscall_filter"] is False
        assert ex.isolation["syscall_filter_reason"] == "switched off (syscall_filter: false)"
        _healthy(ex)


_NO_BINDING_PLUGIN = """
import populora_sandbox.executor

populora_sandbox.executor.SECCOMP_BINDINGS = ("populora_no_such_binding",)  # a machine without the filter
"""


def test_a_run_refuses_to_start_without_the_filter_naming_the_opt_out(tiny_model_dir, tmp_path):
    from tests.cli_helpers import run_cli

    plugin = tmp_path / "no_filter.py"
    plugin.write_text(_NO_BINDING_PLUGIN)
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "tiny_real_2t2s.yaml"
    run_dir = tmp_path / "run"
    args = ["--plugin", str(plugin), "run", str(recipe), f"base_model={tiny_model_dir}", "--run-dir", str(run_dir)]
    refused = run_cli(*args, "--no-progress")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "the sandbox cannot install its system-call filter (seccomp)" in refused.stderr
    assert "executor params `syscall_filter: false`" in refused.stderr
    assert not run_dir.exists()


# --- worker failures and the parent dying -------------------------------------------------------------


def _init_pids(ex) -> list[int]:
    pids = []
    for worker in ex._pool[0]:
        z = worker.proc.pid
        kids = Path(f"/proc/{z}/task/{z}/children").read_text().split()
        pids.append(int(kids[0]) if kids else z)
    return pids


def test_crashed_and_hung_workers_are_replaced():
    from populora_sandbox.executor import SandboxExecutor

    with SandboxExecutor(_params(workers=1, hang_grace_s=1.0)) as ex:
        _healthy(ex)
        os.kill(_init_pids(ex)[0], signal.SIGKILL)  # crash while idle
        time.sleep(0.2)
        _healthy(ex)
        victim = _init_pids(ex)[0]
        os.kill(victim, signal.SIGSTOP)  # hang
        hung = ex.run_batch([ExecJob("x = 1", timeout_s=0.5)])[0]
        assert hung.status == "killed" and "hung" in hung.error
        _healthy(ex)
        assert _init_pids(ex)[0] != victim
        _assert_clean(ex)


_OWNER = """
import json, sys
from populora_sandbox.executor import SandboxExecutor
from populora_sandbox.params import SandboxParams
from populora_core.api.components import ExecJob
ex = SandboxExecutor(SandboxParams(workers=2, namespaces=sys.argv[1] == "1"))
print(json.dumps({"uids": ex.uids, "tmp": [w.fallback_tmp for ws in ex._pool.values() for w in ws]}), flush=True)
ex.run_batch([ExecJob("import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(1000)\\n"
                      "time.sleep(1000)", timeout_s=600)] * 2)
"""


@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "fallback"])
def test_killing_the_parent_leaves_nothing(namespaces):
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, "1" if namespaces else "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        info = json.loads(proc.stdout.readline())
        uids = info["uids"]
        deadline = time.monotonic() + 20
        while len(_processes_of(uids)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # both programs and their daemons are running
        assert len(_processes_of(uids)) >= 4
    finally:
        proc.kill()
        proc.wait()
    marker = f"populora-sandbox:{proc.pid}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = _processes_of(uids) + [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, marker)]
        if not left:
            break
        time.sleep(0.1)
    assert left == []
    if not namespaces:
        # the owner could not clean up: its fallback dirs go when the next executor starts
        from populora_sandbox.executor import SandboxExecutor

        with SandboxExecutor(_params(workers=1, namespaces=False)):
            pass
        assert not any(os.path.exists(t) for t in info["tmp"])


def _cmdline_has(pid: str, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# --- the fallback without namespaces --------------------------------------------------------------------


def test_fallback_without_namespaces():
    from populora_sandbox.executor import SandboxExecutor

    with SandboxExecutor(_params(workers=1, namespaces=False)) as ex:
        assert not ex.isolation["pid_namespace"] and ex.isolation["fallback_reason"]
        tmp = ex._pool[0][0].fallback_tmp
        res = ex.run_batch(
            [
                ExecJob("def f(x):\n    return x + 1", "f(1)"),
                ExecJob("while True:\n    pass", timeout_s=1.0),
                ExecJob("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1000)", "'ok'"),
                ExecJob("open('f.txt', 'w').write('x')", "'wrote'"),
            ]
        )
        assert [r.status for r in res] == ["ok", "timeout", "ok", "ok"]
        assert res[0].value == "2"
        if os.getuid() == 0:
            uid = _run(ex, "import os", "os.getuid()").value
            assert int(uid) in ex.uids
        _assert_clean(ex)
        assert os.listdir(tmp) == []  # the per-program work dir was removed
    assert not os.path.exists(tmp)


def test_require_isolation_fails_loudly_without_namespaces():
    from populora_sandbox.executor import SandboxExecutor, SandboxStartError

    with pytest.raises(SandboxStartError, match="namespaces are required"):
        SandboxExecutor(_params(workers=1, namespaces=False, require_isolation=True))


# --- CLI ----------------------------------------------------------------------------------------------


def test_cli_runs_one_file(tmp_path):
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    prog = tmp_path / "prog.py"
    prog.write_text("print('hello')\nwhile True:\n    pass\n")
    runner = CliRunner()
    out = runner.invoke(cli, ["sandbox", str(prog), "--timeout", "0.5", "--memory-mb", "256"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.output.strip().splitlines()[-1])
    assert result["status"] == "timeout" and set(result) >= {"status", "stdout", "error", "wall_s"}
    prog.write_text("raise ValueError('bad input')\n")
    result = json.loads(runner.invoke(cli, ["sandbox", str(prog)]).output.strip().splitlines()[-1])
    assert result == {**result, "status": "error", "error": "ValueError: bad input"}
    missing = runner.invoke(cli, ["sandbox", str(tmp_path / "missing.py")])
    assert missing.exit_code == 2 and "missing.py" in missing.output


def test_cli_says_whether_the_filter_is_active(tmp_path):
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    prog = tmp_path / "prog.py"
    prog.write_text("x = 1\n")
    runner = CliRunner()
    result = json.loads(runner.invoke(cli, ["sandbox", str(prog)]).output.strip().splitlines()[-1])
    assert result["syscall_filter"] == "active"
    off = runner.invoke(cli, ["sandbox", str(prog), "--no-syscall-filter"])
    assert off.exit_code == 0, off.output
    assert (
        json.loads(off.output.strip().splitlines()[-1])["syscall_filter"] == "off: switched off (syscall_filter: false)"
    )


def test_doctor_says_whether_the_filter_is_active(monkeypatch):
    from click.testing import CliRunner
    from populora_sandbox import executor as module

    from populora_core.cli.commands import cli

    shown = CliRunner().invoke(cli, ["doctor"])
    assert "sandbox       system-call filter: active (pyseccomp" in shown.output, shown.output
    monkeypatch.setattr(module, "SECCOMP_BINDINGS", ("populora_no_such_binding",))
    data = json.loads(CliRunner().invoke(cli, ["doctor", "--json"]).output)
    assert data["components"] == {"sandbox": "system-call filter: off"}
    assert any(
        w.startswith(
            "the sandbox cannot install its system-call filter (seccomp): no seccomp binding could be imported"
        )
        and w.endswith("(runs with the sandbox refuse to start)")
        for w in data["warnings"]
    ), data["warnings"]
