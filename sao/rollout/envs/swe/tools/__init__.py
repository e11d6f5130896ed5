"""Agent tools of the SWE environment (the sandboxed file editor; `bash` is `Sandbox.arun` itself)."""
