"""Native kernels: C++ XLA FFI handlers for the CPU, built on the host at first use (`sao.kernels.build`)."""
