"""USD per million output tokens at the stated load and at the ceiling, from ``review.gpu_price_per_hour`` (per
GPU-hour) for the GPU the records ran on, times the GPUs each job used."""

from __future__ import annotations

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.cost import energy_usd_per_mtok, usd_per_mtok_or_none
from quantverdict.review import document as doc
from quantverdict.review.gpus import gpu_kind_matches
from quantverdict.review.words import say


def gpu_names(environment: list[str]) -> list[str]:
    """The GPU name of each ``GPU: <name> (...)`` line of ``environment``."""
    return [line.removeprefix("GPU: ").split(" (", 1)[0] for line in environment if line.startswith("GPU: ")]


def gpu_price(environment: list[str], prices: dict[str, float]) -> tuple[str, str, float] | None:
    """``(gpu name, kind, USD per GPU-hour)`` for the one GPU kind the records ran on; None without a price, a GPU,
    or with several GPU kinds."""
    names = set(gpu_names(environment))
    if not prices or len(names) != 1:
        return None
    (name,) = names
    return next(((name, str(k), float(p)) for k, p in prices.items() if gpu_kind_matches(str(k), name)), None)


def _energy_cost(sc: doc.Scheme, label: str | None, usd_per_kwh: float | None) -> float | None:
    """USD of GPU energy per million output tokens at the point ``label``; None without a price or an energy."""
    j = next((p.energy_per_output_token_j for p in sc.speed.points if p.label == label), None)
    return energy_usd_per_mtok(j, usd_per_kwh) if j and usd_per_kwh else None


def scheme_cost(sc: doc.Scheme, price: float, usd_per_kwh: float | None = None) -> doc.SchemeCost:
    """One scheme's USD per million output tokens at ``price`` USD per GPU-hour (None without throughput), and of
    GPU energy at ``usd_per_kwh`` (None without a price or a measured energy)."""
    c, at_load = sc.speed.ceiling, sc.speed.at_load
    at, top = at_load.output_tok_s if at_load else None, c.output_tok_s if c else None
    return doc.SchemeCost(
        model=sc.model,
        scheme=sc.scheme,
        gpus=sc.gpus,
        usd_per_mtok_at_load=usd_per_mtok_or_none(price, sc.gpus, at) if at else None,
        at_load_tok_s=at,
        usd_per_mtok_ceiling=usd_per_mtok_or_none(price, sc.gpus, top) if top else None,
        ceiling_tok_s=top,
        ceiling_lower_bound=bool(c and c.lower_bound),
        energy_usd_per_mtok_at_load=_energy_cost(sc, at_load.label if at_load else None, usd_per_kwh),
        energy_usd_per_mtok_ceiling=_energy_cost(sc, c.label if c else None, usd_per_kwh),
    )


def cost_json(cards: list[doc.Scheme], rc: ReviewConfig, environment: list[str]) -> doc.Cost | None:
    """review.json's ``cost``; None without a price for the GPU the records ran on (``environment``'s lines)."""
    if (found := gpu_price(environment, dict(rc.gpu_price_per_hour or {}))) is None:
        return None
    name, kind, price = found
    kwh = rc.energy_usd_per_kwh
    schemes = [scheme_cost(sc, price, kwh) for sc in cards]
    return doc.Cost(gpu=name, gpu_kind=kind, usd_per_gpu_hour=price, usd_per_kwh=kwh, schemes=schemes)


def cost_notes(rc: ReviewConfig, environment: list[str]) -> list[str]:
    """Why a price set in ``rc`` adds no cost line (:func:`cost_json` is None): an electricity price without a GPU
    price, or GPU prices none of which names the one GPU the records ran on (``environment``'s ``GPU: ...``
    lines); [] where the cost line is there or no price is set (words: ``templates/text.j2`` ``cost_note``)."""
    prices = dict(rc.gpu_price_per_hour or {})
    if gpu_price(environment, prices) is not None or not (prices or rc.energy_usd_per_kwh):
        return []
    return [
        say("cost_note", "text.j2", prices=prices, kwh=rc.energy_usd_per_kwh, names=sorted(set(gpu_names(environment))))
    ]
