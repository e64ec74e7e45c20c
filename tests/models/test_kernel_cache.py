"""The native-kernel cache's pruning: needs no compiler, so it lives apart from the kernels' tests (which skip
without one)."""

from __future__ import annotations

from porch_jax.kernels import native


def test_cache_prune_keeps_what_is_in_use_and_drops_what_is_stale(tmp_path):
    """A build deletes the kernel's other libraries unused for STALE_DAYS and day-old partial builds; it keeps
    recent ones (another CPU sharing the folder may be using them), other kernels, and the one just built."""
    import os
    import time

    day = 86400
    files = {
        name: tmp_path / name
        for name in ("k-new.so", "k-old.so", "k-recent.so", "other-old.so", "tmpab.so", "tmpcd.so")
    }
    for path in files.values():
        path.write_bytes(b"")
    age = {"k-old.so": 40, "k-recent.so": 5, "other-old.so": 40, "tmpab.so": 2, "tmpcd.so": 0.1}
    for name, days in age.items():
        stamp = time.time() - days * day
        os.utime(files[name], (stamp, stamp))
    removed = native.prune("k", files["k-new.so"])
    assert sorted(p.name for p in removed) == ["k-old.so", "tmpab.so"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k-new.so", "k-recent.so", "other-old.so", "tmpcd.so"]
