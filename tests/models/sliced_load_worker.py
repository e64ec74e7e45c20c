"""One process of tests/models/test_sliced_load.py: loads a folder (plain: whole, on one device; sliced:
on a mesh over every process's 2 CPU devices), then writes its logits and peak RSS as JSON.

    python sliced_load_worker.py FOLDER OUT.json plain
    python sliced_load_worker.py FOLDER OUT.json sliced ADDRESS PROCESS_ID
"""

import json
import resource
import sys

import jax

folder, out, mode = sys.argv[1:4]
jax.config.update("jax_num_cpu_devices", 2)
if mode == "sliced":
    jax.distributed.initialize(
        coordinator_address=sys.argv[4], num_processes=2, process_id=int(sys.argv[5]), initialization_timeout=60
    )
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from porch_jax.models import from_pretrained, make_mesh  # noqa: E402

KIB = 1024
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mesh = make_mesh((1, 2, 2)) if mode == "sliced" else None
model = from_pretrained(folder, mesh=mesh)
jax.block_until_ready(jax.tree.leaves(jax.tree.map(lambda x: x, model)))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = np.random.RandomState(0).randint(0, model.config.vocab_size, (4, 16)).astype(np.int32)
if mesh is None:
    logits = np.asarray(jax.jit(lambda m, x: m(x))(model, jnp.asarray(ids)))
else:
    with jax.set_mesh(mesh):
        x = jax.make_array_from_callback(ids.shape, jax.sharding.NamedSharding(mesh, jax.P()), lambda i: ids[i])
        logits = np.asarray(multihost_utils.process_allgather(jax.jit(lambda m, x: m(x))(model, x), tiled=True))
with open(out, "w") as f:
    json.dump({"rss_before_mb": before / KIB, "rss_after_load_mb": after / KIB, "logits": logits.tolist()}, f)
