"""torch's own Store contract, restated over ``RedisStore`` with torch's stores as controls.

The installed torch wheel ships neither upstream's ``StoreTestBase``
(``test/distributed/test_store.py``) nor the rendezvous-backend mixin
(``test/distributed/elastic/rendezvous/rendezvous_backend_test.py``): their checks are
restated here in our words, each run over ``RedisStore`` and over torch's ``HashStore`` and
``TCPStore`` (the controls, which must pass them too). torch's ``_test_python_store`` (the
same checks driven from C++ through the trampoline) is shipped, and runs as it is. Also: the
store of ``init_process_group`` outlives a caller that drops it (``new_group`` in real gloo
processes), and torch's ``_store_based_barrier`` waits past a slow rank.
"""

from __future__ import annotations

import json
import os
import time
import warnings
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import DistStoreError
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.rendezvous import RendezvousStateError
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.utils.store import store_timeout

import strata_redis
import strata_redis.torch as strata_torch

from .procs import join_all, spawn

pytestmark = pytest.mark.torch

JOB = "torch-store"
KINDS = ["redis", "hash", "tcp"]


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh, empty store with a 300 s timeout: ``RedisStore`` or a control."""
    kind = request.param
    if kind == "redis":
        ctx = strata_redis.connect(request.getfixturevalue("redis_url"), job_id=JOB).context
        yield strata_torch.RedisStore(ctx, 1, timeout=300)
        ctx.close()
        return
    made: Any = (
        dist.HashStore() if kind == "hash"
        else dist.TCPStore("localhost", 0, 1, True, wait_for_workers=False)
    )  # fmt: skip
    made.set_timeout(timedelta(seconds=300))
    yield made


# -- StoreTestBase, restated ---------------------------------------------------------------
def test_set_get_check_and_counters(store: Any) -> None:
    for n in (1, 2, 3):
        store.add("key", n)
    store.set("key0", "value0")
    store.set("key1", "value1")
    store.set("key2", "value2")
    for n in range(1, 7):
        store.add("key3", n)
    assert store.num_keys() == 5
    assert store.get("key") == b"6"
    assert [store.get(f"key{i}") for i in range(3)] == [b"value0", b"value1", b"value2"]
    assert store.get("key3") == b"21"
    assert store.check(["key3"]) and not store.check(["Randomkey3"])
    store.set("-key3", "7")
    assert store.get("-key3") == b"7"
    assert store.delete_key("-key3")
    assert store.num_keys() == 5


def test_compare_set(store: Any) -> None:
    # a missing key with a non-empty expected value: nothing is set, expected comes back
    assert store.compare_set("cs_key0", "wrong_old_value", "new_value0") == b"wrong_old_value"
    assert not store.check(["cs_key0"])
    store.set("cs_key0", "value0")
    assert store.compare_set("cs_key0", "wrong_old_value", "new_value0") == b"value0"
    assert store.get("cs_key0") == b"value0"
    assert store.compare_set("cs_key0", "value0", "new_value0") == b"new_value0"
    assert store.get("cs_key0") == b"new_value0"
    # a missing key with an empty expected value: set
    assert store.compare_set("cs_key1", "", "new_value1") == b"new_value1"
    assert store.get("cs_key1") == b"new_value1"


def test_wait_times_out_with_torchs_error(store: Any) -> None:
    start = time.monotonic()
    with pytest.raises(DistStoreError, match=r"[Tt]imeout|timed out"):
        store.wait(["bad_key"], timedelta(seconds=0.25))
    assert 0.2 < time.monotonic() - start < 5
    store.add("good_key", 1)
    store.wait(["good_key"])


def test_numkeys_delkeys_and_get_timeout(store: Any) -> None:
    assert store.num_keys() == 0  # (a TCPStore made without waiting for workers)
    for n in (1, 2, 3):
        store.add("key", n)
    store.set("key0", "value0")
    store.add("key3", 1)
    store.set("key1", "value1")
    assert store.num_keys() == 4
    store.delete_key("key")
    assert store.num_keys() == 3
    store.set_timeout(timedelta(seconds=0.3))
    with pytest.raises(DistStoreError):  # a RuntimeError: what torch's callers catch
        store.get("key")
    store.delete_key("key0")
    store.delete_key("key3")
    assert store.num_keys() == 1
    store.set("key4", "value2")
    assert store.num_keys() == 2
    assert store.get("key1") == b"value1" and store.get("key4") == b"value2"


def test_timeout_follows_set_timeout(store: Any) -> None:
    assert store.timeout == timedelta(seconds=300)
    with store_timeout(store, 0.2):  # torch elastic's context: set, then restore
        assert store.timeout == timedelta(seconds=0.2)
        start = time.monotonic()
        with pytest.raises(DistStoreError):
            store.get("missing")
        assert time.monotonic() - start < 5
    assert store.timeout == timedelta(seconds=300)
    # through a PrefixStore (how a process group holds it), as torch's stores do
    dist.PrefixStore("p", store).set_timeout(timedelta(seconds=7))
    assert store.timeout == timedelta(seconds=7)


def test_extended_api(store: Any) -> None:
    assert store.has_extended_api()
    store.set("foo", "po")
    store.append("foo", "tato")
    store.append("bar", "po")
    store.append("bar", "tato")
    assert store.get("foo") == b"potato" and store.get("bar") == b"potato"
    store.multi_set(["m0", "m1"], ["po", "tato"])
    assert store.get("m0") == b"po" and store.get("m1") == b"tato"
    assert store.multi_get(["m0", "m1"]) == [b"po", b"tato"]
    # through a PrefixStore too (the C++ side calls the Python methods)
    prefixed = dist.PrefixStore("p", store)
    assert prefixed.has_extended_api()
    prefixed.multi_set(["a", "b"], [b"\x00", b"\xff"])
    prefixed.append("a", b"\x01")
    assert prefixed.multi_get(["a", "b"]) == [b"\x00\x01", b"\xff"]


def test_clone(store: Any) -> None:
    other = store.clone()
    assert isinstance(other, dist.Store)
    store.set("foo", "bar")
    assert other.get("foo") == b"bar"
    other.set("baz", "bat")
    assert store.get("baz") == b"bat"
    assert other.timeout == store.timeout
    # a clone taken into C++ (PrefixStore holds only its C++ half) keeps working
    prefixed = dist.PrefixStore("p", store.clone())
    prefixed.set("k", "v")
    assert store.get("p/k") == b"v"


def test_clone_in_threads(store: Any) -> None:
    # upstream's bidirectional check without queues: two threads, a clone each
    def ping() -> bytes:
        mine = store.clone()
        mine.set("a", "a1")
        return bytes(mine.get("b"))

    def pong() -> bytes:
        mine = store.clone()
        got = bytes(mine.get("a"))
        mine.set("b", "b1")
        return got

    with ThreadPoolExecutor(max_workers=2) as pool:
        one, two = pool.submit(ping), pool.submit(pong)
        assert (one.result(timeout=30), two.result(timeout=30)) == (b"b1", b"a1")


def test_queues(store: Any) -> None:
    try:
        store.queue_push("test_queue_support", "1")
    except NotImplementedError:
        assert isinstance(store, strata_torch.RedisStore)  # the controls have queues
        pytest.skip("RedisStore has no queues (torch's default: NotImplementedError)")
    assert not store.check(["foo"]) and store.queue_len("foo") == 0
    store.queue_push("foo", "1")
    store.queue_push("foo", "2")
    assert store.check(["foo"]) and store.queue_len("foo") == 2
    assert store.queue_pop("foo") == b"1" and store.queue_pop("foo") == b"2"
    with pytest.raises(dist.QueueEmptyError, match="empty"):
        store.queue_pop("foo", block=False)


def test_python_store_through_the_cpp_trampoline(redis_url: str) -> None:
    # torch's own check (init.cpp), shipped in the wheel: set/get/add/compare_set/clone
    # called from C++; a Python store is the only kind it applies to
    ctx = strata_redis.connect(redis_url, job_id=JOB).context
    dist._test_python_store(strata_torch.RedisStore(ctx, 2, timeout=5))
    ctx.close()


@pytest.mark.slow
def test_store_based_barrier_waits_past_its_logging_interval(store: Any) -> None:
    # torch's _store_based_barrier waits in slices of 10 s and catches RuntimeError between
    # them; a rank 11 s late must still get through before the barrier's own 60 s timeout
    # The late rank is a second client, as it is in a real job: a TCPStore client is one
    # socket, and a thread sharing it waits behind the other's 10 s wait (20 or 30 s in all).
    barrier = dist.distributed_c10d._store_based_barrier
    peer = (
        dist.TCPStore("localhost", store.port, 2, False, timeout=timedelta(seconds=300))
        if isinstance(store, dist.TCPStore)
        else store
    )

    def late_rank() -> None:
        time.sleep(11.0)
        barrier(1, peer, "g", 2, timedelta(seconds=60))

    with ThreadPoolExecutor(max_workers=1) as pool:
        late = pool.submit(late_rank)
        start = time.monotonic()
        barrier(0, store, "g", 2, timedelta(seconds=60))
        waited = time.monotonic() - start
        late.result(timeout=60)
    # it returned, not raised: past the 10 s slice and inside the 60 s timeout
    assert 10.5 < waited < 60


# -- RendezvousBackendTestMixin, restated over C10dRendezvousBackend(store) ------------------
@pytest.fixture
def backend(store: Any) -> C10dRendezvousBackend:
    return C10dRendezvousBackend(store, "run")


def test_rdzv_backend_get_state(backend: C10dRendezvousBackend, store: Any) -> None:
    assert backend.get_state() is None
    backend.set_state(b"x")
    result = backend.get_state()
    assert result is not None and result[0] == b"x" and result[1] is not None
    store.set("torch.rendezvous.run", "non_base64")
    with pytest.raises(RendezvousStateError):
        backend.get_state()


def test_rdzv_backend_set_state_fences(backend: C10dRendezvousBackend) -> None:
    first = backend.set_state(b"x")
    assert first is not None and first[0] == b"x" and first[2]
    token1 = first[1]
    second = backend.set_state(b"y", token1)  # the current token: set
    assert second is not None and second[0] == b"y" and second[2] and second[1] != token1
    for token in (token1, None, "invalid"):  # an old, no or a bad token: the current state
        third = backend.set_state(b"z", token)
        assert third == (b"y", second[1], False)


# -- init_process_group keeps its store alive (issue 25, item 2) -----------------------------
def _group_worker(url: str, worker_id: str, out: str) -> None:
    """One rank: init_process_group without keeping the store, then a subgroup (a barrier
    and an all-reduce on it), a 2-D device mesh, and a late use of the default store."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    warnings.simplefilter("ignore")
    result: dict[str, Any] = {}
    try:
        orch = strata_redis.TrainingOrchestrator(
            coordinator_url=url, worker_id=worker_id, job_id=JOB, min_workers=2,
            max_workers=2, last_call=0.2, elastic=False, heartbeat_timeout=5.0,
            checkpoint_path=Path(out, "ckpt"),
        )  # fmt: skip
        strata_torch.init_process_group(orch, "gloo", timeout=30)  # the store is dropped
        import gc

        gc.collect()
        group = dist.new_group([0, 1])
        dist.barrier(group=group)
        total = torch.tensor([dist.get_rank() + 1])
        dist.all_reduce(total, group=group)
        result["sum"] = int(total.item())
        mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))  # 2-D: subgroups
        total = torch.tensor([dist.get_rank() + 1])
        dist.all_reduce(total, group=mesh.get_group("dp"))
        result["mesh_sum"] = int(total.item())
        store = dist.distributed_c10d._get_default_store()
        store.set(f"late-{dist.get_rank()}", "1")
        store.wait([f"late-{1 - dist.get_rank()}"], timedelta(seconds=20))
        result["store_of"] = strata_torch.store_of() is not None
        world = weakref.ref(dist.group.WORLD)
        del group, mesh  # (the user's last references to the groups)
        dist.destroy_process_group()
        # nothing of strata keeps the destroyed group (and gloo's threads) alive until exit
        result["freed"] = world() is None
        orch.close()
    except Exception as exc:  # reported to the test through the file
        result["error"] = f"{type(exc).__name__}: {exc}"
    Path(out, f"{worker_id}.json").write_text(json.dumps(result))


def test_process_group_keeps_its_store(redis_url: str, tmp_path: Path) -> None:
    procs = [spawn(_group_worker, redis_url, f"w{i}", str(tmp_path)) for i in range(2)]
    codes = join_all(procs, 90)
    results = [
        json.loads(p.read_text()) if (p := tmp_path / f"w{i}.json").exists() else {"error": "none"}
        for i in range(2)
    ]
    assert codes == [0, 0], (codes, results)
    assert results == [{"sum": 3, "mesh_sum": 3, "store_of": True, "freed": True}] * 2, results
