"""BoundedWorker: a deadline really ends the work (the process is gone), memory is capped, errors
come back as data, and the next call after a kill gets a fresh worker."""

from __future__ import annotations

import os
import time

import pytest

from rlcore.bounded import BoundedWorker, CallFailed, CallTimedOut


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:  # a zombie is not running anything
        return f.read().split()[2] != "Z"


def test_a_call_past_its_deadline_kills_the_worker_and_the_next_call_works() -> None:
    worker = BoundedWorker("operator:pow", timeout=0.5)
    try:
        assert worker.call(2, 10) == 1024
        pid = worker._proc.pid  # type: ignore[union-attr]
        t0 = time.monotonic()
        with pytest.raises(CallTimedOut, match="worker killed"):
            worker.call(9, 9**9**2)  # hours of big-int arithmetic
        assert time.monotonic() - t0 < 5
        assert not _alive(pid) and worker.timeouts == 1
        assert worker.call(3, 3) == 27  # a fresh worker
        assert worker._proc.pid != pid  # type: ignore[union-attr]
    finally:
        worker.close()


def test_memory_is_capped_and_errors_come_back_as_data() -> None:
    worker = BoundedWorker("builtins:bytearray", memory_mb=64)
    try:
        assert len(worker.call(1_000_000)) == 1_000_000
        with pytest.raises(CallFailed) as info:
            worker.call(4 * 1024**3)  # 4 GiB
        assert info.value.kind == "MemoryError"
        with pytest.raises(CallFailed) as info:
            worker.call(-1)
        assert info.value.kind == "ValueError"
        assert len(worker.call(10)) == 10  # the same worker carries on
    finally:
        worker.close()


def test_a_target_that_cannot_load_says_so() -> None:
    worker = BoundedWorker("no_such_module_xyz:fn")
    with pytest.raises(CallFailed) as info:
        worker.call(1)
    assert info.value.kind == "ModuleNotFoundError"
    with pytest.raises(ValueError, match="module:attr"):
        BoundedWorker("just_a_name")
