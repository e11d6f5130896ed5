"""Inference engines behind SGLang's HTTP contract: the client (`sglang_client`) and the local JAX engine
(`local_engine` batching core, `http_app` HTTP API, `request_checks` per-request validation, `auth` tokens;
`local_server` launches it as a process running `python -m sao.engines.serve`); `router` runs `sglang-router` in
front of several servers and `fleet` publishes new weights to every server behind it (docs/fleet.md)."""
