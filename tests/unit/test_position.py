"""The data position (``data/position.py``): its JSON record and the merge over ranks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from strata_redis.data.position import (
    Position,
    decode_positions,
    encode_positions,
    merge_positions,
)


@st.composite
def positions(draw: st.DrawFn) -> Position:
    n = draw(st.integers(1, 200))
    shard = st.integers(0, n - 1)
    return Position(
        draw(st.text(min_size=1, max_size=8)),
        draw(st.integers(0, 2**40)),
        n,
        base=draw(st.sets(shard)),
        own=draw(st.sets(shard)),
        partial=draw(st.dictionaries(shard, st.integers(1, 10**6))),
    )


@given(positions())
def test_json_round_trip_keeps_done_and_partial(p: Position) -> None:
    back = Position.from_json(p.to_json())
    assert back.done() == p.done() and back.own == p.done() and back.base == set()
    assert back.partial == p.partial
    assert (back.dataset, back.epoch, back.num_shards) == (p.dataset, p.epoch, p.num_shards)


INT64 = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(positions(), max_size=4), st.dictionaries(st.text(max_size=5), INT64))
def test_encoded_part_round_trips(ps: list[Position], meta: dict[str, int]) -> None:
    meta.pop("positions", None)
    back, rest = decode_positions(encode_positions(ps, meta))
    assert rest == meta
    assert [(b.dataset, b.done(), b.partial) for b in back] == [
        (p.dataset, p.done(), p.partial) for p in ps
    ]


def test_done_bitmap_is_an_eighth_of_the_shards() -> None:
    import base64

    p = Position("d", 0, 80, own={0, 79})
    assert len(base64.b64decode(p.to_json()["done"])) == 10


def test_merge_takes_the_union_and_the_furthest_offsets() -> None:
    a = Position("d", 0, 10, base={0}, own={1}, partial={2: 5, 3: 1})
    b = Position("d", 0, 10, own={3}, partial={2: 7, 4: 0})
    done, offsets = merge_positions([a, b])
    assert done == {0, 1, 3}
    assert offsets == {2: 7}  # shard 3 is done by b; an offset of 0 is none


def test_merge_of_nothing() -> None:
    assert merge_positions([]) == (set(), {})
