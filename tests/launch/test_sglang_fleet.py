"""SGLang fleet commands are rendered (never executed): exact argv per server and router, engine_urls override."""
from __future__ import annotations

import ast
import shlex
import subprocess
import sys

import pytest

from launch import sglang_fleet as fleet
from launch import sweep as s


def _spec(**kw):
  args = dict(model_path="/mnt/models/qwen", gpu_hosts=("gpu-0", "gpu-1"), gpus_per_host=8, tp_size=4)
  args.update(kw)
  return fleet.FleetSpec(**args)


def test_two_servers_per_host_then_router_exact_argv():
  commands = fleet.plan(_spec())
  assert [(c.role, c.host) for c in commands] == [("sglang", "gpu-0"), ("sglang", "gpu-0"), ("sglang", "gpu-1"),
                                                  ("sglang", "gpu-1"), ("router", "gpu-0")]
  assert commands[1].argv[:2] == ("ssh", "gpu-0")
  assert shlex.split(commands[1].argv[2]) == [
      "python3", "-m", "sglang.launch_server", "--model-path", "/mnt/models/qwen", "--host", "0.0.0.0",
      "--port", "30001", "--tp-size", "4", "--base-gpu-id", "4", "--mem-fraction-static", "0.85",
      "--weight-version", "0"]
  assert shlex.split(commands[-1].argv[2]) == [
      "python3", "-m", "sglang_router.launch_router", "--worker-urls", "http://gpu-0:30000", "http://gpu-0:30001",
      "http://gpu-1:30000", "http://gpu-1:30001", "--host", "0.0.0.0", "--port", "30080", "--policy", "cache_aware",
      "--health-check-interval-secs", "10", "--worker-startup-timeout-secs", "1800"]


def test_the_installed_router_parses_the_router_command():
  """The argv is checked against sglang-router's own argument parser (the test extra installs it)."""
  from sao.engines import router as router_lib  # pylint: disable=g-import-not-at-top
  router_lib.require_router()  # an ImportError naming the test extra when it is missing
  from sglang_router import launch_router  # pylint: disable=g-import-not-at-top
  argv = shlex.split(fleet.plan(_spec(router_policy="round_robin", router_health_check_interval_s=7))[-1].argv[2])
  assert argv[1:3] == ["-m", "sglang_router.launch_router"]
  args = launch_router.parse_router_args(argv[3:])
  assert args.worker_urls == list(fleet.server_urls(_spec()))
  assert (args.host, args.port, args.policy) == ("0.0.0.0", 30080, "round_robin")
  assert (args.health_check_interval_secs, args.worker_startup_timeout_secs) == (7, 1800)


def test_optional_server_args_and_engine_urls():
  spec = _spec(gpu_hosts=("g",), tp_size=8, context_length=32768, random_seed=3, mem_fraction_static=0.7,
               extra_server_args=("--chunked-prefill-size", "8192"), router=False, python="/opt/py")
  (server,) = fleet.plan(spec)
  assert shlex.split(server.argv[2]) == [
      "/opt/py", "-m", "sglang.launch_server", "--model-path", "/mnt/models/qwen", "--host", "0.0.0.0",
      "--port", "30000", "--tp-size", "8", "--base-gpu-id", "0", "--mem-fraction-static", "0.7",
      "--weight-version", "0", "--context-length", "32768", "--random-seed", "3", "--chunked-prefill-size", "8192"]
  assert fleet.engine_urls(spec) == ("http://g:30000",)
  assert fleet.engine_urls_override(_spec(router_host="lb", router_port=9000)) == \
      "--config.engine_urls=('http://lb:9000',)"
  # The override parses back to the tuple ml_collections expects.
  override = fleet.engine_urls_override(_spec(router=False))
  assert ast.literal_eval(override.split("=", 1)[1]) == ("http://gpu-0:30000", "http://gpu-0:30001",
                                                          "http://gpu-1:30000", "http://gpu-1:30001")


def test_render_ends_with_the_override():
  text = fleet.render(_spec())
  assert text.count("sglang.launch_server") == 4 and "# router on gpu-0" in text
  assert text.splitlines()[-1] == "--config.engine_urls=('http://gpu-0:30080',)"


@pytest.mark.parametrize("kw, match", [
    (dict(gpu_hosts=()), "gpu_hosts"),
    (dict(gpu_hosts=("a", "a")), "duplicate"),
    (dict(tp_size=3), "tp_size"),
    (dict(model_path=""), "model_path"),
    (dict(mem_fraction_static=1.5), "mem_fraction_static"),
    (dict(router_policy="fastest"), "router_policy"),
    (dict(router_host="gpu-0", router_port=30001), "collides"),
    (dict(router_port=30000), "collides"),
    (dict(router_health_check_interval_s=0), "router_health_check_interval_s"),
])
def test_spec_errors_name_the_problem(kw, match):
  with pytest.raises(ValueError, match=match):
    _spec(**kw)


def test_cli_renders_without_executing():
  result = subprocess.run([sys.executable, "-m", "launch.sglang_fleet", "--gpu_hosts=g0", "--tp_size=8",
                           "--config=experiments/configs/sao_openswe.py:full", "--server_arg=--enable-metrics"],
                          cwd=s.REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert "--model-path Qwen/Qwen3.5-35B-A3B" in result.stdout  # defaulted from the config's model.hf_path
  assert "--enable-metrics" in result.stdout
  assert result.stdout.strip().splitlines()[-1] == "--config.engine_urls=('http://g0:30080',)"
