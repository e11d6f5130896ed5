"""Runs inside a sandbox: socket() through the i386 (`int 0x80`) and x32 ABIs, and AF_VSOCK; prints {name: result}."""
import ctypes, mmap, socket
def run(code):
  buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
  buf.write(code)
  addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
  return ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
# push rbx; mov eax,359 (i386 socket); mov ebx,2 (AF_INET); mov ecx,1; xor edx,edx; int 0x80; pop rbx; ret
i386 = bytes.fromhex("53" "b867010000" "bb02000000" "b901000000" "31d2" "cd80" "5b" "c3")
# mov eax, 0x40000000|41 (x32 socket); mov edi,2; mov esi,1; xor edx,edx; syscall; ret
x32 = bytes.fromhex("b829000040" "bf02000000" "be01000000" "31d2" "0f05" "c3")
out = {"i386": run(i386), "x32": run(x32)}
try:
  socket.socket(40, socket.SOCK_STREAM); out["vsock"] = 0
except OSError as e:
  out["vsock"] = -e.errno
print(out)
