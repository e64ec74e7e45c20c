"""GAIA2 on Meta ARE: our orchestrator and sub-agents run as an ARE agent, scored by the GAIA2 judge.

ARE (``meta-agents-research-environments`` 1.2.0) pins ``datasets==4.0.0`` and so a
``huggingface-hub`` that transformers 5.24 rejects, so it lives in its own virtual environment
(``scripts/install_are.sh``, default ``.venv-are``). Everything that imports ARE (``agent``,
``env``, ``clock``, ``plan``, ``runner``) runs there; the main environment drives it through
``client.run_gaia2``, which starts ``python -m porch_jax.envs.are.runner`` in that venv and reads
back a JSON summary and a trajectory store. ``tools`` and ``scripted`` import no ARE code.
"""
