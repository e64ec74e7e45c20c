"""Process-level settings that make XLA:CPU faster; launchers and benchmarks call them at start-up.

`tune_malloc`: XLA:CPU allocates every step's temporaries afresh. By default glibc serves big
blocks with mmap (or from per-thread arenas that it trims), so each train step page-faults
hundreds of MB back in (~110k faults, ~25% of a step of benchmarks/bench_train_step.py). One
arena, no mmap and no trimming remove them: that step's CPU time drops from ~1,050-1,100 ms to
~800-820 ms (1 thread, same machine, alternating runs). The cost: freed memory stays in the
process (its peak RSS) instead of returning to the OS.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def tune_malloc() -> bool:
    """Keeps freed memory in one glibc heap instead of returning it to the OS.

    Call it before the first computation (arenas already handed to threads stay). Returns False,
    doing nothing, where the C library is not glibc; raises OSError if glibc refuses a setting.
    """
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    for option, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1)):
        if not mallopt(option, value):
            raise OSError(f"mallopt({option}, {value}) failed")
    return True
