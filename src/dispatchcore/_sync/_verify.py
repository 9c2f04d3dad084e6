"""``WeightSync.verify``'s driver side: which ranks digest which regions, and the comparison.

Every region of the plan (one per piece, unsplit by buckets) is digested by
every source rank that holds it (so diverged replicas show) and by every
destination that wants it (from what it holds now); only digests travel.
``check`` is ``WeightSync.verify``; ``check_sent`` is ``verify=True``, which
collects the digests the ranks took during the transfer (regions: the
transfer plan's pieces) and asks only non-sending replicas for theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._transfer import Held, TensorSpec, TransferPlan
from .._transfer._checksum import Region
from .._transfer._errors import WeightMismatchError
from ._steps import Side, submit, wait
from ._timeline import Timeline

#: At most this many mismatches are spelled out in the error (all are in ``.mismatches``).
_SHOWN = 8


def regions_of(
    plan: TransferPlan, held: Sequence[Mapping[str, Held]], tensors: Mapping[str, TensorSpec]
) -> tuple[list[tuple[Region, int, tuple[int, ...]]], list[list[Region]], list[list[Region]]]:
    """Every region with its sending source and destinations; each source's and each destination's list."""
    regions: list[tuple[Region, int, tuple[int, ...]]] = []
    sources: list[list[Region]] = [[] for _ in held]
    destinations: list[list[Region]] = [[] for _ in plan.wanted]
    for bucket in plan.buckets:
        for piece in bucket.pieces:
            region: Region = (len(regions), piece, tensors[piece.name].full_shape)
            regions.append((region, bucket.source, bucket.destinations))
            for s, offered in enumerate(held):
                h = offered.get(piece.source_name)
                if h is not None and h.offset <= piece.rows[0] and piece.rows[1] <= h.offset + h.rows:
                    sources[s].append(region)
            for d in bucket.destinations:
                destinations[d].append(region)
    return regions, sources, destinations


def check(
    src: Side,
    dst: Side,
    tid: int,
    plan: TransferPlan,
    held: Sequence[Mapping[str, Held]],
    tensors: Mapping[str, TensorSpec],
    read: str,
) -> list[str]:
    """Digest every region on the ranks and compare; the names checked, or :class:`WeightMismatchError`."""
    regions, per_source, per_destination = regions_of(plan, held, tensors)
    src_steps = [(("source_sums", tid, mine),) for mine in per_source]
    dst_steps = [
        (("destination_sums", tid, dst.prefix + read, mine, {n: w.rows[0] for n, w in plan.wanted[d].items()}),)
        for d, mine in enumerate(per_destination)
    ]
    handles = [submit(src, range(len(src.ranks)), src_steps), submit(dst, range(len(dst.ranks)), dst_steps)]
    from_sources = wait(src, handles[0], "verify")
    from_destinations = wait(dst, handles[1], "verify")
    return _report(src, dst, regions, from_sources, from_destinations, tensors)


def check_sent(
    src: Side,
    dst: Side,
    tid: int,
    plan: TransferPlan,
    held: Sequence[Mapping[str, Held]],
    tensors: Mapping[str, TensorSpec],
    timeline: Timeline,
) -> list[str]:
    """``verify=True``: compare the digests the transfer took as it went; the names, or the mismatch.

    The sending source digested each piece as it packed it and each destination each name after its
    apply hook took it (``_transfer._rank``); only a replica that did not send a region digests it
    now, so replicas that differ still show.
    """
    regions, per_source, _ = regions_of(plan, held, tensors)
    keys = {key: n for n, key in enumerate((b.index, i) for b in plan.buckets for i in range(len(b.pieces)))}
    replicas = [[r for r in mine if regions[r[0]][1] != s] for s, mine in enumerate(per_source)]
    handles = [
        submit(src, range(len(src.ranks)), [(("sent_sums", tid, mine),) for mine in replicas]),
        submit(dst, range(len(dst.ranks)), [(("held_sums", tid),)] * len(dst.ranks)),
    ]
    from_sources = [{**{keys[k]: v for k, v in sent.items()}, **more} for sent, more in wait(src, handles[0], "verify")]
    got = wait(dst, handles[1], "verify")
    from_destinations = [{keys[k]: v for k, v in sums.items()} for sums, _ in got]
    timeline.ranks(dst, range(len(dst.ranks)), [spans for _, spans in got])
    return _report(src, dst, regions, from_sources, from_destinations, tensors)


def _report(
    src: Side,
    dst: Side,
    regions: list[tuple[Region, int, tuple[int, ...]]],
    from_sources: list[Any],
    from_destinations: list[Any],
    tensors: Mapping[str, TensorSpec],
) -> list[str]:
    """Raise :class:`WeightMismatchError` for what differs; else the names checked."""
    mismatches = _per_name_and_rank(_compare(src, dst, regions, from_sources, from_destinations))
    if mismatches:
        shown = "; ".join(_said(name, rank, why) for name, rank, why in mismatches[:_SHOWN])
        more = f"; and {len(mismatches) - _SHOWN} more" if len(mismatches) > _SHOWN else ""
        raise WeightMismatchError(
            f"weights of {dst.role} group {dst.label} differ from {src.role} group {src.label}'s: {shown}{more}",
            tuple(mismatches),
        )
    return sorted(tensors)


def _compare(
    src: Side,
    dst: Side,
    regions: list[tuple[Region, int, tuple[int, ...]]],
    sources: list[Any],
    destinations: list[Any],
) -> list[tuple[str, int, str]]:
    out: list[tuple[str, int, str]] = []
    for (index, piece, _), sender, readers in regions:
        where = f"rows {piece.rows[0]}..{piece.rows[1]}" + (f", {piece.cut}" if piece.cut is not None else "")
        digests = {src.ranks[s]: got[index] for s, got in enumerate(sources) if index in got}
        if len(set(digests.values())) > 1:
            out.append((piece.name, -1, f"source ranks {sorted(digests)} hold different bytes at {where}"))
        expected = sources[sender][index]
        for d in readers:
            got = destinations[d].get(index, "never read back after its apply")
            if got != expected:
                why = got if " " in got else f"other bytes at {where}"  # a digest has no spaces, a reason has
                out.append((piece.name, dst.ranks[d], why))
    return out


def _per_name_and_rank(found: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """One entry per name and rank, its regions' reasons joined (a name's shards would repeat it)."""
    joined: dict[tuple[str, int], list[str]] = {}
    for name, rank, why in found:
        joined.setdefault((name, rank), []).append(why)
    return [(name, rank, "; ".join(whys)) for (name, rank), whys in joined.items()]


def _said(name: str, rank: int, why: str) -> str:
    return f"{name!r} ({why})" if rank < 0 else f"{name!r} on destination rank {rank} ({why})"
