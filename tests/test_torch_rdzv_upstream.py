"""What torch's ``DynamicRendezvousHandler`` promises (upstream's
``dynamic_rendezvous_test.py``, restated in our words), checked through the public
``RendezvousHandler`` API on the strata handler, each beside torch's own ``c10d`` handler
over a TCPStore on 127.0.0.1 as the control: the same test body runs on both.

The one step outside the public API is a node's loss: each backend stops its heartbeats its
own way (``_lose``), as upstream's test stops a handler's keep-alive. A node sees the others'
changes within a second or so (the c10d handler caches the shared state for a second), so
views across nodes are polled.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch  # noqa: F401  (the module needs it; skip cleanly without)
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
)
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from strata_redis.torch import rdzv

from .procs import kill9, spawn, wait_for

pytestmark = [pytest.mark.torch, pytest.mark.timeout(90)]

BACKENDS = ["strata", "c10d"]


class Call(threading.Thread):
    """``next_rendezvous`` of one handler on a thread of its own: its result or its error."""

    def __init__(self, handler: RendezvousHandler) -> None:
        super().__init__(daemon=True, name="next-rendezvous")
        self.handler = handler
        self.result: RendezvousInfo | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.handler.next_rendezvous()
        except BaseException as exc:  # reported by outcome()
            self.error = exc

    def outcome(self, timeout: float = 30.0) -> RendezvousInfo:
        """The rendezvous it got (re-raising its error, or failing if still blocked)."""
        self.join(timeout)
        assert not self.is_alive(), "next_rendezvous still blocked"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Maker:
    """A factory of handlers of one job (one run id) on one backend: ``maker(min, max,
    **conf)`` makes one; ``spec`` gives the ``RendezvousParameters`` arguments it would use
    (a real process of its own can make the same handler from them)."""

    def __init__(self, backend: str, endpoint: str) -> None:
        self.backend, self.endpoint = backend, endpoint
        self.made: list[RendezvousHandler] = []

    def spec(self, min_nodes: int, max_nodes: int, **conf: Any) -> dict[str, Any]:
        config = {"join_timeout": "20", "last_call_timeout": "1", "keep_alive_interval": "1",
                  "keep_alive_max_attempt": "5", **conf}  # fmt: skip
        if self.backend == "strata" and "worker_id" not in config:
            config["worker_id"] = f"agent-{len(self.made)}"  # one process plays every agent
        return dict(
            backend=self.backend, endpoint=self.endpoint, run_id="upstream",
            min_nodes=min_nodes, max_nodes=max_nodes, local_addr="127.0.0.1", **config,
        )  # fmt: skip

    def __call__(self, min_nodes: int, max_nodes: int, **conf: Any) -> RendezvousHandler:
        params = RendezvousParameters(**self.spec(min_nodes, max_nodes, **conf))
        handler = get_rendezvous_handler(params)
        self.made.append(handler)
        return handler


@pytest.fixture(params=BACKENDS)
def make(request: pytest.FixtureRequest) -> Iterator[Maker]:
    """A ``Maker`` on the backend under test; every handler made is shut down at the end."""
    backend = str(request.param)
    if backend == "strata":
        endpoint = str(request.getfixturevalue("redis_url"))
    else:
        endpoint = f"127.0.0.1:{_free_port()}"
        # torch's shared-TCPStore path publishes rank 0's bootstrap address only in a
        # handler's first round (or on becoming rank 0), so a node admitted later to a round
        # whose rank 0 was rank 0 before waits for it forever: the unshared path publishes it
        # every round (torch 2.13)
        monkeypatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    maker = Maker(backend, endpoint)
    yield maker
    for handler in maker.made:
        with contextlib.suppress(Exception):  # a handler the test already shut down or lost
            handler.shutdown()


def _lose(handler: RendezvousHandler) -> None:
    """The node of ``handler`` is lost: its heartbeats stop (not a public API step)."""
    if isinstance(handler, rdzv.StrataRendezvousHandler):
        assert handler.worker is not None
        handler.worker.stop_heartbeat()
    else:
        handler._stop_heartbeats()


def _full_round(make: Maker, n: int, **conf: Any) -> tuple[list[RendezvousHandler], list[Any]]:
    """``n`` handlers with max nodes ``n`` meet in one round."""
    handlers = [make(1, n, **conf) for _ in range(n)]
    calls = [Call(h) for h in handlers]
    infos = [c.outcome() for c in calls]
    assert sorted(i.rank for i in infos) == list(range(n))
    assert {i.world_size for i in infos} == {n}
    return handlers, infos


def _stays_blocked(call: Call, seconds: float, watch: Callable[[], None]) -> None:
    """``call`` is still waiting after ``seconds``; ``watch()`` is asserted meanwhile."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        watch()
        assert call.is_alive(), f"next_rendezvous returned: {call.result or call.error!r}"
        time.sleep(0.25)


def test_all_nodes_join_one_round(make: Maker) -> None:
    handlers, _ = _full_round(make, 2)
    assert all(h.num_nodes_waiting() == 0 for h in handlers)
    assert not any(h.is_closed() for h in handlers)


def test_an_admissible_late_node_is_counted_and_admitted(make: Maker) -> None:
    """A node arriving while a round below max nodes runs is in the wait list: the members
    see it, and their next rendezvous admits it (the last call leaves the late node time to
    see the new round)."""
    first = make(1, 2, last_call_timeout="3")
    assert Call(first).outcome().world_size == 1
    late = Call(make(1, 2, last_call_timeout="3"))
    wait_for(lambda: first.num_nodes_waiting() == 1, 20, step=0.1, why=first.num_nodes_waiting)
    again = Call(first).outcome()
    info = late.outcome()
    assert (again.world_size, info.world_size) == (2, 2)
    assert {again.rank, info.rank} == {0, 1}
    assert first.num_nodes_waiting() == 0


def test_a_spare_beyond_max_nodes_is_not_counted(make: Maker) -> None:
    """Issue 25, 1: the round is at max nodes, so a third node is redundant: the members'
    ``num_nodes_waiting`` stays 0 (torchrun would restart their workers for nothing)."""
    members, _ = _full_round(make, 2)
    spare = Call(make(1, 2))

    def none_waiting() -> None:
        assert [m.num_nodes_waiting() for m in members] == [0, 0]

    _stays_blocked(spare, 3.0, none_waiting)


def test_a_spare_waits_past_join_timeout(make: Maker) -> None:
    """Issue 25, 6: a redundant node waits for a place, with no join timeout (upstream keeps
    it in the redundancy list) instead of failing with a timeout."""
    members, _ = _full_round(make, 2, join_timeout="1")
    spare = Call(make(1, 2, join_timeout="1"))
    _stays_blocked(spare, 4.0, lambda: None)  # four join timeouts
    assert all(m.num_nodes_waiting() == 0 for m in members)


def test_a_spare_takes_a_lost_members_place(make: Maker) -> None:
    """A member's node is lost: the spare becomes an admissible waiting node, the survivor
    counts it, and its next rendezvous forms a round with the spare."""
    (survivor, lost), _ = _full_round(make, 2, last_call_timeout="5")
    spare = Call(make(1, 2, last_call_timeout="5"))
    time.sleep(1.5)  # the spare is waiting (uncounted) before the loss
    assert survivor.num_nodes_waiting() == 0
    _lose(lost)
    wait_for(
        lambda: survivor.num_nodes_waiting() == 1, 30, step=0.2, why=survivor.num_nodes_waiting
    )
    again = Call(survivor).outcome()
    info = spare.outcome()
    assert (again.world_size, info.world_size) == (2, 2)
    assert {again.rank, info.rank} == {0, 1}


def _wait_as_node(spec: dict[str, Any]) -> None:
    """A node of its own process (``spawn``): it joins and waits for its rendezvous."""
    get_rendezvous_handler(RendezvousParameters(**spec)).next_rendezvous()


def test_a_dead_waiting_node_stops_counting(redis_url: str) -> None:
    """A node waiting for admission (the round runs below max nodes) is killed with SIGKILL:
    the members stop counting it within its keep-alive timeout (plus slack), and go on not
    counting it (torchrun restarts the members' workers while ``num_nodes_waiting() > 0``:
    counted, a node that never comes would restart them round after round). While it lives
    it stays counted well past that timeout: a waiter's looks keep its entry fresh.
    Strata only: under c10d a node started in a process of its own with this test's
    in-process TCPStore host forms a rendezvous of its own (rank 0 of 1), so torch's control
    cannot run the same body."""
    make = Maker("strata", redis_url)
    # 4 attempts, not 2: the waiter's entry (refreshed every timeout / 4) and the members'
    # heartbeats (every 1 s) outlive a stall of 3 s of a loaded machine, not 1.5 s
    conf = {"keep_alive_interval": "1", "keep_alive_max_attempt": "4", "last_call_timeout": "1"}
    members = [make(1, 3, **conf) for _ in range(2)]
    infos = [c.outcome() for c in [Call(m) for m in members]]
    assert {i.world_size for i in infos} == {2}
    timeout = 1 * (4 + 0.5)  # strata's heartbeat timeout; c10d's would be 1 x 4
    waiter = spawn(_wait_as_node, make.spec(1, 3, worker_id="waiter", **conf))
    try:

        def counts() -> list[int]:
            return [m.num_nodes_waiting() for m in members]

        wait_for(lambda: counts() == [1, 1], 40, step=0.1, why=counts)
        end = time.monotonic() + 2 * timeout
        while time.monotonic() < end:  # alive: counted, past two timeouts
            assert counts() == [1, 1]
            time.sleep(0.25)
        killed = time.monotonic()
        kill9(waiter)
        # + slack for a stalled poller: a dead waiter counted for good never drops
        took = wait_for(lambda: counts() == [0, 0], timeout + 4, step=0.05, why=counts)
        assert time.monotonic() - killed <= timeout + 4, took
        end = time.monotonic() + 3.0
        while time.monotonic() < end:  # and it does not come back
            assert counts() == [0, 0]
            time.sleep(0.25)
    finally:
        if waiter.is_alive():
            kill9(waiter)
        for handler in make.made:
            handler.shutdown()


def test_shutdown_closes_the_rendezvous_for_late_nodes(make: Maker) -> None:
    """Issue 25, 3: ``shutdown`` (torchrun calls it when a run is over) closes the
    rendezvous: the others see it closed, and a node started later with the same run id
    gets ``RendezvousClosedError`` instead of a new round."""
    (first, second), _ = _full_round(make, 2)
    assert first.shutdown()
    wait_for(second.is_closed, 10, step=0.2)
    late = make(1, 2)
    wait_for(late.is_closed, 10, step=0.2)
    with pytest.raises(RendezvousClosedError):
        Call(late).outcome()


def test_a_waiting_spare_exits_gracefully_when_the_run_ends(make: Maker) -> None:
    """The run ends while a spare waits: the spare's rendezvous ends with
    ``RendezvousGracefulExitError`` (torchrun's agent then exits quietly), not a timeout."""
    (first, second), _ = _full_round(make, 2)
    spare = Call(make(1, 2))
    time.sleep(1.5)  # it waits as a spare
    assert spare.is_alive()
    first.shutdown()
    second.shutdown()
    with pytest.raises(RendezvousGracefulExitError):
        spare.outcome()


def test_set_closed_is_seen_by_every_node(make: Maker) -> None:
    (first, second), _ = _full_round(make, 2)
    assert not first.is_closed() and not second.is_closed()
    second.set_closed()
    assert second.is_closed()
    wait_for(first.is_closed, 10, step=0.2)
    with pytest.raises(RendezvousClosedError):
        Call(first).outcome()
