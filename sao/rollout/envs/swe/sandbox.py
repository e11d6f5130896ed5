"""One episode's private working copy of a repository, and the sandboxed command runner over it.

Every command (the agent's `bash` calls, the editor, the grader's test runs) is a fresh `bash -c` inside
bubblewrap: new PID, network, IPC and UTS namespaces, an unprivileged host identity without capabilities
(`identity.py`: a dedicated uid when the trainer is root, keyrings cleared on lease, a fresh session keyring per
command), a seccomp filter that refuses IP, packet and vsock sockets and every foreign-ABI system call (`bwrap.py`),
a read-only view of the system with only the needed parts of `/etc` (`jail.py`), private size-limited `/tmp` and
`/dev/shm`, a memory cgroup per sandbox where the host allows one (`cgroup.py`), and
exactly one writable host directory — the episode's repository, mounted at `/testbed` (SWE-bench's path). Other
episodes' directories, the project checkout and the home directories are simply not mounted; the network namespace
has no route out.

Limits: each command gets a wall-clock timeout (the whole PID namespace is killed), `ulimit` CPU-seconds /
address-space / file-size / process-count limits (set hard, so the command cannot raise them; the process count is
the sandbox's own: its uid or user namespace holds nothing else), and its merged stdout+stderr is cut to
`max_output_bytes` (head and tail kept, a marker in between: `command_output`). The repository may grow by at most
`disk_mb` and `max_inodes` over the episode: it is measured while each command runs and after it; a command that
crosses a limit is killed and its result says `limit="disk"` — the sandbox is then spent (`Sandbox.spent`), and the
episode must end.

Commands do not share a shell: each starts in `/testbed` with a clean environment, as in mini-swe-agent, and
background processes die with the command (the PID namespace goes away).

Isolation "none" runs the same commands without namespaces or a separate identity; it exists for machines without
user namespaces and must be chosen explicitly (`SandboxConfig(isolation="none")`), never as a fallback. Its timeout
still kills the command's process group and every process that holds the command's output pipe (so a `setsid`
child cannot make `run()` hang).

    sandbox = Sandbox.create(repo_git_dir, base_commit, SandboxConfig())
    result = sandbox.run("python -m pytest -q")      # or: await sandbox.arun(...)
    print(result.output, result.exit_code, result.timed_out)
    sandbox.close()                                  # also: `with Sandbox.create(...) as sandbox:`
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
import time
import weakref

from sao.rollout.envs.swe import base_tree
from sao.rollout.envs.swe import bwrap
from sao.rollout.envs.swe import cgroup as cgroup_lib
from sao.rollout.envs.swe import command_output
from sao.rollout.envs.swe import disk
from sao.rollout.envs.swe import identity as identity_lib
from sao.rollout.envs.swe import jail
from sao.rollout.envs.swe import procs

WORKDIR = jail.WORKDIR
ISOLATIONS = ("bwrap", "none")


class SandboxError(RuntimeError):
  """The sandbox itself failed (could not copy the repository, start bwrap, ...): an environment failure."""


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Limits and isolation of every command.

  Attributes:
    timeout_s: wall-clock seconds per command; the command's whole process tree is then killed.
    cpu_s: CPU seconds per process (`ulimit -t`).
    memory_mb: address space per process (`ulimit -v`).
    file_mb: largest file a command may write (`ulimit -f`).
    max_processes: processes (and threads) the sandbox may hold at once (`ulimit -u`; bwrap isolation only).
    disk_mb: how much the repository may grow over the whole episode (see the module docstring).
    sandbox_memory_mb: memory of all the sandbox's processes together (their tmpfs pages and memfds included),
      enforced by a memory cgroup per sandbox where the host lets the trainer create one (`Sandbox.memory_bound`).
    max_inodes: how many files, directories and symlinks the repository may gain over the episode (inodes are a
      host resource of their own: 100,000 symlinks cost 2 MiB of bytes but 100,000 inodes).
    tmp_mb: size of each command's private `/tmp` (and of `/dev/shm`), a tmpfs (bwrap isolation only).
    disk_check_s: how often a running command's repository is measured against `disk_mb`.
    max_output_bytes: the command's output is cut to this many bytes (head + tail, a marker in between).
    isolation: "bwrap" (namespaces; the default) or "none" (no isolation: only when explicitly configured).
    root: where episode directories are created (default: the system temp dir).
    env: extra environment variables of every command. The default turns off pytest's plugin autoloading: the
      host's plugins (hypothesis, jax helpers, ...) would cost seconds per test run and are not the repository's.
  """
  timeout_s: float = 60.0
  cpu_s: int = 60
  memory_mb: int = 4096
  sandbox_memory_mb: int = 8192
  file_mb: int = 256
  max_processes: int = 512
  disk_mb: int = 1024
  max_inodes: int = 100_000
  tmp_mb: int = 512
  disk_check_s: float = 1.0
  max_output_bytes: int = 10_000
  isolation: str = "bwrap"
  root: str | None = None
  env: tuple[tuple[str, str], ...] = (("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1"),)

  def __post_init__(self):
    if self.isolation not in ISOLATIONS:
      raise ValueError(f"SandboxConfig.isolation: {self.isolation!r} is not one of {ISOLATIONS}")
    for name in ("timeout_s", "cpu_s", "memory_mb", "sandbox_memory_mb", "file_mb", "max_output_bytes",
                 "max_processes", "disk_mb", "max_inodes", "tmp_mb", "disk_check_s"):
      if getattr(self, name) <= 0:
        raise ValueError(f"SandboxConfig.{name}: must be > 0, got {getattr(self, name)}")


def _python_prefix() -> str:
  """The installation directory of this interpreter (mounted read-only, so `python` works inside)."""
  return os.path.realpath(sys.base_prefix)


def git(repo: pathlib.Path | str, *args: str, input: str | None = None, timeout: float = 120) -> str:
  """Runs trusted git on a trusted repository (never on an episode's copy: its .git is agent-controlled)."""
  proc = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True, text=True,
                        timeout=timeout, env=_git_env())
  if proc.returncode != 0:
    raise SandboxError(f"git {' '.join(args[:3])} in {repo} failed (exit {proc.returncode}): {proc.stderr[-800:]}")
  return proc.stdout


def _git_env() -> dict[str, str]:
  # Fixed identity and dates: deterministic commits, and no dependence on the user's git config.
  return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
          "GIT_AUTHOR_NAME": "sao", "GIT_AUTHOR_EMAIL": "sao@localhost", "GIT_COMMITTER_NAME": "sao",
          "GIT_COMMITTER_EMAIL": "sao@localhost", "GIT_AUTHOR_DATE": "1700000000 +0000",
          "GIT_COMMITTER_DATE": "1700000000 +0000", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
          "GIT_TERMINAL_PROMPT": "0",
          "LC_ALL": "C"}


class Sandbox:
  """An episode directory holding a fresh checkout, and the runner of commands confined to it."""

  def __init__(self, episode_dir: pathlib.Path, config: SandboxConfig, pool: str = "agent"):
    self.config = config
    self.episode_dir = episode_dir
    self.repo_dir = episode_dir / "repo"
    self.closed = False
    self.spent = ""  # the limit that ended the episode ("disk"), or ""
    self._bwrap = bwrap.ensure_bwrap() if config.isolation == "bwrap" else None
    try:
      self.identity = (identity_lib.lease(pool, os.path.join(_python_prefix(), "bin", "python3"))
                       if self._bwrap is not None else None)
    except identity_lib.IdentityError as e:
      raise SandboxError(str(e)) from e
    if self.identity is not None and self.identity.drop:
      try:
        jail.check_drop(self._bwrap)
      except identity_lib.IdentityError as e:
        self.identity.release()
        raise SandboxError(str(e)) from e
    self._cgroup = (cgroup_lib.MemoryCgroup.create(episode_dir.name, config.sandbox_memory_mb << 20)
                    if self._bwrap is not None else None)
    self.memory_bound = self._cgroup is not None
    # Cleanup even when the owner forgets close() or is cancelled mid-episode: runs at GC or interpreter exit.
    self._finalizer = weakref.finalize(self, _cleanup, episode_dir, self.identity, self._cgroup)
    # Outside the repository, so not visible in the sandbox.
    self._seccomp_path = episode_dir / "seccomp.bpf"
    self._passwd_path, self._group_path = episode_dir / "passwd", episode_dir / "group"
    if self._bwrap is not None:
      self._seccomp_path.write_bytes(bwrap.seccomp_program())
      self._passwd_path.write_text(self.identity.passwd())
      self._group_path.write_text(self.identity.group())
      if self.identity.drop:
        try:
          identity_lib.chown_tree(self.repo_dir, self.identity.uid, self.identity.gid)
        except OSError as e:  # e.g. a root-squashed network file system under `config.root`
          self.close()
          raise SandboxError(f"cannot give {self.repo_dir} to the sandbox's uid {self.identity.uid}: {e}") from e
    used_bytes, used_inodes = disk.tree_usage(self.repo_dir)
    self._disk_budget = used_bytes + config.disk_mb * (1 << 20)
    self._inode_budget = used_inodes + config.max_inodes

  @classmethod
  def create(cls, source_repo: pathlib.Path | str, base_commit: str, config: SandboxConfig = SandboxConfig(),
             prefix: str = "sao_swe_", overlay: dict[str, bytes | None] | None = None, pool: str = "agent"
             ) -> Sandbox:
    """A fresh episode: clones `source_repo` (a local git repository or bundle) and checks out `base_commit`.

    Only history up to `base_commit` is in the copy (`base_tree.history_upto`; no later object, no branches, tags
    or remote), so neither `git log` nor `git fsck --lost-found` shows the fix. `overlay` (path -> content, None to delete) is written over the checkout before any command
    runs (the grader's tree: see `disk.write_overlay`). Raises `SandboxError` if the copy cannot be made.
    """
    if config.isolation == "bwrap":
      bwrap.ensure_bwrap()  # fail before creating anything
    root = pathlib.Path(config.root) if config.root else pathlib.Path(tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    episode_dir = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    try:
      repo = episode_dir / "repo"
      try:  # only the history up to base_commit: no later object (the fix, hidden tests) is in the copy
        history = base_tree.history_upto(str(source_repo), base_commit)
      except (base_tree.BaseTreeError, OSError) as e:
        raise SandboxError(f"cannot read {source_repo} at {base_commit}: {e}") from e
      subprocess_run = lambda *a: subprocess.run(a, capture_output=True, text=True, timeout=300, env=_git_env())
      proc = subprocess_run("git", "clone", "-q", "--no-checkout", "--no-hardlinks", history, str(repo))
      if proc.returncode != 0:
        raise SandboxError(f"cannot clone {source_repo}: {proc.stderr.strip()[-800:]}")
      git(repo, "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", base_commit)
      git(repo, "remote", "remove", "origin")
      refs = git(repo, "for-each-ref", "--format=%(refname)").split()
      if refs:
        git(repo, "update-ref", "--no-deref", "--stdin", input="".join(f"delete {r}\n" for r in refs))
      if overlay:
        try:
          disk.write_overlay(repo, overlay)
        except (ValueError, OSError) as e:
          raise SandboxError(f"cannot write the graded tree: {e}") from e
      return cls(episode_dir, config, pool)
    except BaseException:
      disk.rmtree(episode_dir)
      raise

  @classmethod
  async def acreate(cls, source_repo: pathlib.Path | str, base_commit: str, config: SandboxConfig = SandboxConfig(),
                    prefix: str = "sao_swe_", overlay: dict[str, bytes | None] | None = None, pool: str = "agent"
             ) -> Sandbox:
    """`create` off the event loop. If the caller is cancelled meanwhile, the sandbox is closed as soon as the
    (uninterruptible) copy finishes, so a cancelled episode never leaves its directory behind."""
    future = asyncio.ensure_future(asyncio.to_thread(cls.create, source_repo, base_commit, config, prefix, overlay,
                                                      pool))
    try:
      return await asyncio.shield(future)
    except asyncio.CancelledError:
      future.add_done_callback(_close_orphan)
      raise

  def __enter__(self) -> Sandbox:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Deletes the episode directory (idempotent)."""
    self.closed = True
    self._finalizer()

  # ----------------------------------------------------------------------------------------------------------------
  # Commands.

  def _argv(self, command: str, seccomp_fd: int | None = None) -> list[str]:
    c = self.config
    # `ulimit` without -S/-H sets both limits, so the command cannot raise them again.
    nproc = f" -u {c.max_processes}" if self._bwrap is not None else ""
    # A fresh session keyring per command (bwrap isolation): never the trainer's, never another command's.
    keyring = identity_lib.SESSION_KEYRING_SHIM.format(nr=identity_lib.keyctl_number()) if self._bwrap else ""
    shim = f"python3 -I -S -c {shlex.quote(keyring)} " if keyring else ""
    script = (f"ulimit -t {c.cpu_s} -v {c.memory_mb * 1024} -f {c.file_mb * 1024} -c 0{nproc} 2>/dev/null || "
              f"{{ echo 'sandbox: cannot set limits' >&2; exit 125; }}; exec {shim}bash -c {shlex.quote(command)}")
    env = {"PATH": f"{_python_prefix()}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "TERM": "dumb", "PAGER": "cat",
           "GIT_PAGER": "cat", "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "agent",
           "GIT_AUTHOR_EMAIL": "agent@sandbox", "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@sandbox",
           **dict(c.env)}
    if self._bwrap is None:
      return ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", "-c", script]
    argv = jail.bwrap_argv(self._bwrap, self.identity, str(self.repo_dir), str(self._passwd_path),
                           str(self._group_path), _python_prefix(), env, script, tmp_bytes=c.tmp_mb << 20,
                           shm_bytes=min(c.tmp_mb, 64) << 20, seccomp_fd=seccomp_fd)
    return self._cgroup.wrap(argv) if self._cgroup is not None else argv

  async def arun(self, command: str, timeout_s: float | None = None, stdin: bytes | None = None,
                 max_output_bytes: int | None = None) -> command_output.CommandResult:
    """Runs `command` in the sandbox. Never raises for what the command does; raises `SandboxError` if the
    sandbox cannot start, and on cancellation kills the command before re-raising."""
    if self.closed:
      raise SandboxError(f"sandbox {self.episode_dir} is closed")
    if self.spent:
      raise SandboxError(f"sandbox {self.episode_dir} is spent: its episode exceeded its {self.spent} limit")
    timeout = self.config.timeout_s if timeout_s is None else float(timeout_s)
    limit = self.config.max_output_bytes if max_output_bytes is None else int(max_output_bytes)
    start = time.monotonic()
    loop = asyncio.get_running_loop()
    seccomp_fd = os.open(self._seccomp_path, os.O_RDONLY) if self._bwrap is not None else None
    # Our own output pipe (not asyncio's): we can stop reading it, and find every process that holds it.
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    try:
      # bwrap itself gets an empty environment too: it stays visible inside as /proc/1/environ.
      proc = await asyncio.create_subprocess_exec(
          *self._argv(command, seccomp_fd), stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
          stdout=write_fd, stderr=subprocess.STDOUT, start_new_session=True,
          env={"PATH": "/usr/bin:/bin"}, cwd=self.repo_dir if self._bwrap is None else "/",
          pass_fds=() if seccomp_fd is None else (seccomp_fd,))
    except BaseException as e:
      os.close(read_fd)
      if isinstance(e, OSError):
        raise SandboxError(f"cannot start the sandbox: {e}") from e
      raise
    finally:
      os.close(write_fd)  # the child has its own copies
      if seccomp_fd is not None:
        os.close(seccomp_fd)
    pipe_inode = os.fstat(read_fd).st_ino
    reader = asyncio.StreamReader(limit=1 << 20)
    read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                     os.fdopen(read_fd, "rb", buffering=0))
    output = command_output.BoundedOutput(limit)

    async def pump():
      if stdin is not None:
        proc.stdin.write(stdin)
        try:
          await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
          pass  # the command did not read its input: its choice, not a sandbox failure
        proc.stdin.close()
      while chunk := await reader.read(65536):
        output.add(chunk)
      return await proc.wait()

    over_disk = False

    async def watch_disk():
      nonlocal over_disk
      while True:
        await asyncio.sleep(self.config.disk_check_s)
        if await asyncio.to_thread(self._over_budget):
          over_disk = True
          procs.kill_session(proc)
          return

    timed_out = False
    watcher = asyncio.ensure_future(watch_disk())
    try:
      exit_code = await asyncio.wait_for(pump(), timeout)
    except TimeoutError:
      timed_out, exit_code = True, None
    finally:
      watcher.cancel()
      read_transport.close()  # stop reading, whoever still holds the pipe
      if proc.returncode is None or timed_out:
        procs.kill_session(proc)
        if self._bwrap is None:
          procs.kill_pipe_holders(pipe_inode)  # e.g. a `setsid` child: outside the process group, no PID namespace
        await proc.wait()
    if not over_disk and await asyncio.to_thread(self._over_budget):
      over_disk = True
    if over_disk:
      self.spent, exit_code, timed_out = "disk", None, False
    text, truncated = output.text()
    return command_output.CommandResult(output=text, exit_code=exit_code, timed_out=timed_out, truncated=truncated,
                                        duration_s=time.monotonic() - start, limit=self.spent if over_disk else "")

  def _over_budget(self) -> bool:
    used_bytes, used_inodes = disk.tree_usage(self.repo_dir)
    return used_bytes > self._disk_budget or used_inodes > self._inode_budget

  def run(self, command: str, timeout_s: float | None = None, stdin: bytes | None = None,
          max_output_bytes: int | None = None) -> command_output.CommandResult:
    """Synchronous `arun`, for threads without a running event loop (e.g. `asyncio.to_thread(env.step, ...)`)."""
    try:
      asyncio.get_running_loop()
    except RuntimeError:
      return asyncio.run(self.arun(command, timeout_s, stdin, max_output_bytes))
    raise RuntimeError("Sandbox.run() called from a running event loop; use `await sandbox.arun(...)`")


def _close_orphan(future: asyncio.Future) -> None:
  if not future.cancelled() and future.exception() is None:
    future.result().close()


def _cleanup(episode_dir: pathlib.Path, identity: identity_lib.Identity | None,
             cgroup: cgroup_lib.MemoryCgroup | None) -> None:
  try:
    disk.rmtree(episode_dir)
    if cgroup is not None:
      cgroup.remove()
  finally:
    if identity is not None:
      identity.release()  # only once nothing of the episode is left
