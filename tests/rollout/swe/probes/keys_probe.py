"""Runs inside a sandbox: `put` stores a key in the session, user and user-session keyrings, `get` looks for it."""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def keyctl(*a): 
  r = libc.syscall(250, *[ctypes.c_long(x) for x in a]); return r if r >= 0 else -ctypes.get_errno()
def add_key(desc, data, ring):
  r = libc.syscall(248, b"user", desc, data, ctypes.c_size_t(len(data)), ctypes.c_long(ring)); return r if r >= 0 else -ctypes.get_errno()
def search(desc, ring):
  r = libc.syscall(250, ctypes.c_long(10), ctypes.c_long(ring), b"user", desc, ctypes.c_long(0)); return r if r >= 0 else -ctypes.get_errno()
op = sys.argv[1]
if op == "put":
  print({ring: add_key(b"sao_leak", b"hidden test", ring) for ring in (-3, -4, -5)})
else:
  print({ring: search(b"sao_leak", ring) for ring in (-3, -4, -5)})
