"""Runs inside a sandbox: `hold` creates a SysV shared-memory segment and an abstract unix socket and waits; `look`
tries to reach both. Prints {name: result} (a negative errno when refused)."""
import ctypes, socket, sys, time
KEY, NAME = 0x5A043, b"\0sao_ipc_probe"
libc = ctypes.CDLL(None, use_errno=True)
if sys.argv[1] == "hold":
  shm = libc.shmget(KEY, 4096, 0o1000 | 0o666)  # IPC_CREAT
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(NAME)
  listener.listen()
  print({"shm": shm if shm >= 0 else -ctypes.get_errno(), "socket": 0}, flush=True)
  time.sleep(float(sys.argv[2]))
else:
  shm = libc.shmget(KEY, 0, 0)
  out = {"shm": shm if shm >= 0 else -ctypes.get_errno()}
  try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(NAME)
    out["socket"] = 0
  except OSError as e:
    out["socket"] = -e.errno
  print(out, flush=True)
