r"""Trains an agent with SAO (or GSPO/GRPO) from an experiment config.

    python experiments/train.py --config=experiments/configs/sao_openswe.py:toy --workdir=/tmp/sao_toy

Roles (`--config.role`):
- embedded (default): on this machine, over loopback, the trainer plus `num_engines` local JAX engine servers
  (`python -m sao.engines.serve`) and `num_workers` rollout worker processes (`python -m sao.rollout.worker`, given
  this command's `--config` flags). With `--config.engine_urls=http://host:port,...` external SGLang
  servers/routers are used instead of local engines.
- trainer: only the trainer (workers on other hosts connect to `server.host:server.port`).
- worker: only a rollout worker; `--trainer=host:port`.

A trainer (embedded or alone) can be one process of a multi-process trainer job (docs/tpu.md, "Multi-host trainer"):
`--config.jax_distributed` on a TPU pod (JAX detects the job: one process per host), or explicit coordinates on CPU
hosts, `--config.distributed.coordinator_address=<process 0's host:port> --config.distributed.num_processes=P
--config.distributed.process_id=<i>` (`python -m launch.local --trainer_processes=P -- <these flags>` starts such a
job on one machine). Process 0 serves gRPC, writes metrics and publishes weights; every process runs the learner.

Re-running the same command with the same `--workdir` resumes from the latest checkpoint. The run itself is
`launch.run.run`.
"""
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # `experiments`, `launch` imports

from sao.engines import host_platform  # noqa: E402  (imports no JAX)

host_platform.pin_cpu_without_accelerator()  # before JAX is imported: no libtpu probing on a CPU-only host

from launch import run as run_lib  # noqa: E402


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _CONFIG, _WORKDIR, _TRAINER, _WORKER_INDEX  # pylint: disable=global-statement
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (get_config(arg)).",
                                            lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, logs, exported policies).")
  _TRAINER = flags.DEFINE_string("trainer", "", "worker role: the trainer's gRPC address.")
  _WORKER_INDEX = flags.DEFINE_integer("worker_index", None, "worker role: this worker's index (names it).")
  flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  run_lib.run(_CONFIG.value, _WORKDIR.value, run_lib.config_flag_args(flags.FLAGS["config"]), _TRAINER.value,
              _WORKER_INDEX.value)


if __name__ == "__main__":
  define_flags()
  logging.set_verbosity(logging.WARNING)
  app.run(main)
