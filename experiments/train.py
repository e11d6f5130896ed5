r"""Trains an agent with SAO (or GSPO/GRPO) from an experiment config.

    python experiments/train.py --config=experiments/configs/sao_openswe.py:toy --workdir=/tmp/sao_toy

Roles (`--config.role`):
- embedded (default): on this machine, over loopback, the trainer plus `num_engines` local JAX engine servers
  (`python -m sao.engines.serve`) and `num_workers` rollout worker processes (`python -m sao.rollout.worker`).
  With `--config.engine_urls=http://host:port,...` external SGLang servers/routers are used instead of local engines.
- trainer: only the trainer (workers on other hosts connect to `server.host:server.port`); with
  `--config.jax_distributed` it calls `jax.distributed.initialize()` first (TPU pods: one process per host).
- worker: only a rollout worker; `--trainer=host:port`.

Re-running the same command with the same `--workdir` resumes from the latest checkpoint.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # `experiments.configs` imports

from sao.engines import lifetime  # noqa: E402  (no JAX import: safe before the config is read)

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (get_config(arg)).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, logs, exported policies).")
_TRAINER = flags.DEFINE_string("trainer", "", "worker role: the trainer's gRPC address.")
flags.mark_flags_as_required(["config", "workdir"])


def _tasks(config):
  from sao.rollout import envs  # pylint: disable=g-import-not-at-top
  env = envs.make(config.env.name, **config.env.kwargs)
  return (env.tasks("train", config.env.num_train_tasks, config.seed),
          env.tasks("validation", config.env.num_validation_tasks, config.seed + 1))


def _harness_flags(config) -> list[str]:
  """The rollout worker's harness-mixture flags from `config.rollout` (none when the config names no harnesses)."""
  r = config.rollout
  names = tuple(r.get("harnesses", ()) or ())
  if not names:
    return []
  weights = tuple(r.get("harness_weights", ()) or ())
  return [f"--harnesses={','.join(names)}", f"--harness_weights={','.join(str(w) for w in weights)}",
          f"--eval_harness={r.get('eval_harness', '') or ''}", f"--harness_seed={config.seed}"]


def _env_flags(config) -> list[str]:
  """The rollout worker's environment constructor kwargs (sandbox limits etc.; tasks carry the rest)."""
  kwargs = config.env.kwargs.to_dict() if hasattr(config.env.kwargs, "to_dict") else dict(config.env.kwargs)
  return [f"--env_kwargs={json.dumps({config.env.name: kwargs})}"] if kwargs else []


def _tokenizer(config):
  from sao.models.tokenizer import Tokenizer, toy_tokenizer  # pylint: disable=g-import-not-at-top
  path = config.model.tokenizer_path or (config.model.hf_path if config.model.init == "hf" else "")
  return Tokenizer.from_pretrained(path) if path else toy_tokenizer()


class EmbeddedProcesses:
  """Local engine servers and rollout workers as child processes; logs under `<workdir>/logs/`.

  A rollout worker that dies is restarted (its leases expire and the trainer re-leases their tasks), at most
  `MAX_WORKER_RESTARTS` times per run; a dead engine stops the run.
  """
  MAX_WORKER_RESTARTS = 10  # a worker that keeps dying is a bug to surface, not a fault to ride out

  def __init__(self, config, workdir: str):
    self.config = config
    self.log_dir = os.path.join(workdir, "logs")
    os.makedirs(self.log_dir, exist_ok=True)
    self.engines = []
    self.workers: list[tuple[subprocess.Popen, str]] = []
    self.trainer_address = ""
    self.worker_restarts = 0

  def start_engines(self, model_dir: str) -> list[str]:
    from sao.engines.local_server import start_local_engine  # pylint: disable=g-import-not-at-top
    c = self.config
    urls = []
    for i in range(c.num_engines):
      handle, url = start_local_engine(
          model_dir, log_path=os.path.join(self.log_dir, f"engine{i}.log"),
          engine_args=[f"--max_batch_size={max(c.rollout.concurrency, 1)}", "--batch_window_ms=5",
                       f"--new_token_buckets={c.rollout.max_new_tokens}",
                       f"--batch_buckets={','.join(str(b) for b in _batch_buckets(c.rollout.concurrency))}",
                       f"--prompt_buckets={','.join(str(b) for b in _prompt_buckets(c.rollout.max_total_tokens))}",
                       # Each (batch, prompt) bucket compiles once; the persistent cache makes a resumed run or
                       # the next experiment start in seconds.
                       f"--compilation_cache_dir={os.path.join(self.log_dir, os.pardir, 'jax_cache')}"])
      self.engines.append(handle)
      urls.append(url)
    print(f"[embedded] engines: {urls}", flush=True)
    return urls

  def _spawn_worker(self, i: int) -> tuple[subprocess.Popen, str]:
    c = self.config
    log_path = os.path.join(self.log_dir, f"worker{i}.log")
    cmd = [sys.executable, "-m", "sao.rollout.worker", f"--trainer={self.trainer_address}",
           f"--concurrency={c.rollout.concurrency}", f"--max_new_tokens={c.rollout.max_new_tokens}",
           f"--max_turns={c.rollout.max_turns}", f"--max_total_tokens={c.rollout.max_total_tokens}",
           *_harness_flags(c), *_env_flags(c)]
    if c.model.tokenizer_path or c.model.init == "hf":
      cmd.append(f"--tokenizer_path={c.model.tokenizer_path or c.model.hf_path}")
    with open(log_path, "ab") as log_file:
      process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=lifetime.child_env())  # the worker exits when this process dies
    return process, log_path

  def start_workers(self, trainer_address: str) -> None:
    c = self.config
    self.trainer_address = trainer_address
    for i in range(c.num_workers):
      self.workers.append(self._spawn_worker(i))
    print(f"[embedded] {c.num_workers} worker(s) × {c.rollout.concurrency} agent loops → {trainer_address}",
          flush=True)

  def check_alive(self) -> None:
    for handle in self.engines:
      if not handle.alive():
        raise RuntimeError(f"engine {handle.url} died; log tail:\n{handle.log_tail()}")
    for i, (process, log_path) in enumerate(self.workers):
      if process.poll() is None:
        continue
      with open(log_path, "rb") as f:
        tail = f.read()[-4000:].decode(errors="replace")
      if self.worker_restarts >= self.MAX_WORKER_RESTARTS:
        raise RuntimeError(f"rollout worker {i} exited with code {process.returncode} after "
                           f"{self.worker_restarts} restarts; log tail:\n{tail}")
      self.worker_restarts += 1
      self.workers[i] = self._spawn_worker(i)
      print(f"[embedded] rollout worker {i} exited with code {process.returncode}; restarted it as pid "
            f"{self.workers[i][0].pid} (restart {self.worker_restarts}/{self.MAX_WORKER_RESTARTS}); its leases "
            f"expire and are re-leased. Log tail:\n{tail[-1000:]}", flush=True)

  def stop(self) -> None:
    for process, _ in self.workers:
      if process.poll() is None:
        process.terminate()
    for process, _ in self.workers:
      try:
        process.wait(timeout=20)
      except subprocess.TimeoutExpired:
        process.kill()
    for handle in self.engines:
      handle.stop()


def _batch_buckets(concurrency: int) -> list[int]:
  """Few batch shapes (each one is a compile): quarters of the concurrency up to all of it."""
  return sorted({max(1, concurrency // 8), max(1, concurrency // 2), concurrency})


def _prompt_buckets(max_total_tokens: int) -> list[int]:
  buckets, b = [], 64
  while b < max_total_tokens:
    buckets.append(b)
    b *= 2
  return buckets + [max_total_tokens]


def run_trainer(config, workdir: str):
  from sao.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from sao.analysis import curves  # pylint: disable=g-import-not-at-top
  if config.jax_distributed:
    import jax  # pylint: disable=g-import-not-at-top
    jax.distributed.initialize()
  tokenizer = _tokenizer(config)
  train_tasks, validation_tasks = _tasks(config)

  def demonstrations():
    from sao.rollout.demonstrations import demonstration_trajectories  # pylint: disable=g-import-not-at-top
    r = config.recipe
    return demonstration_trajectories(config.env.name, tokenizer, r.num_demonstrations, config.seed,
                                      noise=r.demonstration_noise, env_kwargs=dict(config.env.kwargs),
                                      harnesses=tuple(config.rollout.get("harnesses", ()) or ()),
                                      harness_weights=tuple(config.rollout.get("harness_weights", ()) or ()))

  if config.role == "embedded" and not config.engine_urls:
    processes = EmbeddedProcesses(config, workdir)
    launcher = trainer_lib.Launcher(processes.start_engines, processes.start_workers, processes.stop,
                                    processes.check_alive)
  elif config.role == "embedded":
    processes = EmbeddedProcesses(config, workdir)
    launcher = trainer_lib.Launcher(lambda _: list(config.engine_urls), processes.start_workers, processes.stop,
                                    processes.check_alive)
  else:  # trainer alone: engines and workers are someone else's
    launcher = trainer_lib.Launcher(lambda _: list(config.engine_urls), lambda address: None)
  trainer = trainer_lib.Trainer(config, workdir, tokenizer, train_tasks, validation_tasks)
  summary = trainer.run(launcher, demonstrations if config.recipe.sft_steps else None)
  png = curves.plot_training_curves(os.path.join(workdir, "metrics.jsonl"), os.path.join(workdir, "curves.png"))
  base, final, best = trainer.validation_summary()
  print(f"[done] {config.name}: validation {base:.3f} (base policy) → {final:.3f} (mean of the last 3 evaluations; "
        f"best {best:.3f}); last step {summary}; "
        f"curves: {png}", flush=True)


def main(argv):
  del argv
  config = _CONFIG.value
  workdir = _WORKDIR.value
  if config.role in ("embedded", "trainer"):
    run_trainer(config, workdir)
  elif config.role == "worker":
    if not _TRAINER.value:
      raise app.UsageError("--trainer is required for role=worker")
    cmd = [sys.executable, "-m", "sao.rollout.worker", f"--trainer={_TRAINER.value}",
           f"--concurrency={config.rollout.concurrency}", f"--max_new_tokens={config.rollout.max_new_tokens}",
           f"--max_turns={config.rollout.max_turns}", f"--max_total_tokens={config.rollout.max_total_tokens}",
           *_harness_flags(config), *_env_flags(config)]
    if config.model.tokenizer_path or config.model.init == "hf":
      cmd.append(f"--tokenizer_path={config.model.tokenizer_path or config.model.hf_path}")
    if config.engine_urls:
      cmd.append(f"--engine_urls={','.join(config.engine_urls)}")
    os.execv(sys.executable, cmd)
  else:
    raise app.UsageError(f"config.role: unknown role {config.role!r} (embedded | trainer | worker)")


if __name__ == "__main__":
  logging.set_verbosity(logging.WARNING)
  app.run(main)
