"""One process of the coordination test's 2-process job (`tests/multihost.run_processes`); not a test file.

Process 0 shares five messages (the third with trajectories); process 1 prints what it received in order. Then, with
`--diverge`, the processes agree on one plan, then
plan differently and print the `Diverged` error. With `--hang`, process 1 freezes itself (SIGSTOP: alive but silent) and process 0 waits in `check()` until the watchdog
declares it lost; the `ProcessLost` message is printed and the process ends with `EXIT_PROCESS_LOST`.
"""
import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests import multihost  # noqa: E402

process_id = multihost.initialize_from_env()
from sao.train import coordination  # noqa: E402
from tests.train import helpers  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--hang", action="store_true")
parser.add_argument("--diverge", action="store_true")
args = parser.parse_args()

channel = coordination.create(heartbeat_timeout_s=3.0, heartbeat_interval_s=0.25, exit_grace_s=30.0)
trajectories = helpers.trajectories(seed=1, n=3)
received = []
for n in range(5):
  if process_id == 0:
    message = channel.share(f"m{n}", {"n": n}, trajectories if n == 2 else ())
  else:
    message = channel.share(f"m{n}")
  received.append([message.tag, message.data, [t.to_bytes().hex()[:16] for t in message.trajectories],
                   [t == u for t, u in zip(message.trajectories, trajectories)]])
print("RECEIVED " + json.dumps(received), flush=True)
if args.diverge:  # the same plan agrees; then each process plans a different update and must say so, not hang
  print("AGREED " + json.dumps(channel.agree("update", {"groups": [[8, 64]]}, {"stop": process_id == 1})), flush=True)
  try:
    channel.agree("update", {"groups": [[8, 64]] * (process_id + 1)})
  except coordination.Diverged as e:
    print(f"DIVERGED {e}", flush=True)
if args.hang:
  if process_id == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
  start = time.monotonic()
  try:
    while True:
      channel.check()
      time.sleep(0.1)
  except coordination.ProcessLost as e:
    print(f"LOST after {time.monotonic() - start:.1f}s: {e}", flush=True)
    os._exit(coordination.EXIT_PROCESS_LOST)
channel.close()
