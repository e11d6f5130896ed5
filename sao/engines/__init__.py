"""Inference engines behind SGLang's HTTP contract: the client (`sglang_client`) and the local JAX engine
(`local_server`, run with `python -m sao.engines.serve`)."""
