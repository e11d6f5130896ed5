"""A stand-in for experiments/train.py in launcher tests: behaviour chosen by `--config.seed`.

seed 0 or ≥ 3: succeeds; seed 1: fails with exit code 3; seed 2: the first attempt leaves a checkpoint and is killed
(SIGKILL), the next one finds the checkpoint and succeeds ("resumed"). Every attempt appends a line to
`<workdir>/attempts`. With FAKE_TRAIN_SHARED set, records how many fake runs were alive at once.
"""
import json
import os
import signal
import sys
import time

args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
workdir, seed = args["workdir"], int(args.get("config.seed", "0"))
os.makedirs(workdir, exist_ok=True)
with open(os.path.join(workdir, "attempts"), "a") as f:
  f.write(args["config"] + "\n")
shared = os.environ.get("FAKE_TRAIN_SHARED")
if shared:
  mine = os.path.join(shared, "running", os.path.basename(workdir))
  os.makedirs(os.path.dirname(mine), exist_ok=True)
  open(mine, "w").close()
  with open(os.path.join(shared, "concurrency"), "a") as f:
    f.write(f"{len(os.listdir(os.path.dirname(mine)))}\n")
  time.sleep(0.4)
  os.remove(mine)
print(f"fake training {args['config']} seed {seed}", flush=True)
with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
  f.write(json.dumps({"step": 7, "time": 0.0, "reward": 0.5}) + "\n")
if seed == 1:
  print("boom: the fake trainer failed", file=sys.stderr, flush=True)
  sys.exit(3)
if seed == 2:
  checkpoint = os.path.join(workdir, "checkpoint")
  if not os.path.exists(checkpoint):
    open(checkpoint, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
  print("resumed from checkpoint", flush=True)
