"""tests/aot: the ahead-of-time compile analysis (`sao.aot`)."""
