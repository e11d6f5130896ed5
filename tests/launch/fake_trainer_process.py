"""A stand-in for one process of `experiments/train.py` in a trainer job (tests/launch/test_local.py): records its
argv and environment in `<workdir>/process<i>.json`; `FAKE_FAIL=<i>` makes process i exit with code 3, and the
others then wait (as live trainer processes would, until they notice) unless `FAKE_WAIT_S=0`."""
import json
import os
import sys
import time

args = sys.argv[1:]
value = lambda name: next(a.split("=", 1)[1] for a in args if a.startswith(f"--{name}="))  # noqa: E731
process_id = int(value("config.distributed.process_id"))
workdir = value("workdir")
with open(os.path.join(workdir, f"process{process_id}.json"), "w") as f:
  json.dump({"argv": args, "xla_flags": os.environ.get("XLA_FLAGS"), "platforms": os.environ.get("JAX_PLATFORMS")}, f)
print(f"fake trainer process {process_id}", flush=True)
if os.environ.get("FAKE_FAIL") == str(process_id):
  sys.exit(3)
if os.environ.get("FAKE_FAIL"):
  time.sleep(float(os.environ.get("FAKE_WAIT_S", "60")))
