"""The user's cache of SageMaker training prices read from AWS's Price List API.

``tiered-training prices --region R`` reads the prices (:mod:`tiered_training.aws.prices`) and
:func:`save_region` writes them here; the planner reads them with :func:`lookup`, offline, and
never calls AWS. The file is ``$XDG_CACHE_HOME/tiered-training/prices.json`` (default
``~/.cache/tiered-training/prices.json``): per region, the date it was read and, per instance, the
price per hour, its currency, the SKU, the usage type and the price list's dates.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT = 1
SOURCE = "AWS Price List API (pricing:GetProducts, AmazonSageMaker)"


@dataclass(frozen=True)
class CachedPrice:
    region: str
    instance: str
    price_per_hour: float
    currency: str
    sku: str
    usagetype: str
    effective: str  # the on-demand term's effectiveDate
    publication: str  # the price list's publicationDate
    read: str  # when it was read (UTC, ISO 8601)

    def source(self) -> str:
        """Where the price comes from and its dates, for a plan."""
        return (
            f"{SOURCE}, {self.region}, SKU {self.sku}, effective {self.effective[:10]}, "
            f"published {self.publication[:10]}, read {self.read[:10]}"
        )


class PriceCacheError(Exception):
    """The cache file cannot be read (not JSON, not this format); one line."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tiered-training"


def cache_path() -> Path:
    return cache_dir() / "prices.json"


def load() -> dict[str, dict[str, CachedPrice]]:
    """The cached prices by region and instance; empty without a cache. Raises :class:`PriceCacheError`."""
    path = cache_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise PriceCacheError(f"the price cache {path} is unreadable ({error})") from None
    try:
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {FORMAT}")
        return {
            region: {name: CachedPrice(**entry) for name, entry in instances.items()}
            for region, instances in data["regions"].items()
        }
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise PriceCacheError(f"the price cache {path} is not one this version writes ({error})") from None


def lookup(region: str, instance: str) -> tuple[CachedPrice | None, str | None]:
    """The cached price of ``instance`` in ``region`` (or None), and what is wrong with the cache (or None)."""
    try:
        return load().get(region, {}).get(instance), None
    except PriceCacheError as error:
        return None, str(error)


def save_region(region: str, prices: list[CachedPrice]) -> Path:
    """Replace ``region``'s prices in the cache, keeping the other regions'; written whole, then renamed."""
    try:
        regions = load()
    except PriceCacheError:
        regions = {}  # an unreadable cache is rewritten
    regions[region] = {p.instance: p for p in sorted(prices, key=lambda p: p.instance)}
    data = {
        "format": FORMAT,
        "source": SOURCE,
        "regions": {r: {n: asdict(p) for n, p in found.items()} for r, found in sorted(regions.items())},
    }
    import tempfile  # here: planning reads the cache, and tempfile costs every command's start

    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".tmp", delete=False) as out:
        json.dump(data, out, indent=1, sort_keys=True)
        out.write("\n")
    os.replace(out.name, path)
    return path
