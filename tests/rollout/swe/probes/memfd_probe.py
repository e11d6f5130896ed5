"""Runs inside a sandbox: writes argv[1] MiB into four memfds, printing its progress."""
import os, sys
total_mib, files = int(sys.argv[1]), 4
chunk = b"x" * (1 << 20)
fds = [os.memfd_create(f"m{i}") for i in range(files)]
for mib in range(total_mib):
  os.write(fds[mib % files], chunk)
  if mib % 32 == 0:
    print(f"wrote {mib} MiB", flush=True)
print(f"done {total_mib} MiB", flush=True)
