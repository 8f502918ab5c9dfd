"""SageMaker on-demand training prices from AWS's Price List API, into the user's price cache.

``GetProducts`` (service code ``AmazonSageMaker``) on the Price List API's endpoint in us-east-1
(it also answers in eu-central-1 and ap-south-1), filtered by ``regionCode`` and by the usage type
of training (``USE1-Train:ml.p5.48xlarge``). Each entry of ``PriceList`` is a JSON document with
``product.attributes`` and ``terms.OnDemand.<term>.priceDimensions.<dimension>.pricePerUnit.USD``
(https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html).
The prices are written with :func:`tiered_training.catalog.price_cache.save_region`; the planner
reads them from there and never calls AWS.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from tiered_training.aws.session import StartError, aws_client, aws_errors
from tiered_training.catalog.price_cache import CachedPrice

PRICING_REGION = "us-east-1"
SERVICE_CODE = "AmazonSageMaker"
# On-demand training: "<region prefix>-Train:<instance>"; spot ("-Train-Spot:"), training plans and
# other usage types of training do not match.
TRAINING_USAGE = re.compile(r"^[A-Z0-9]+-Train:(ml\.[a-z0-9][a-z0-9.-]*)$")
PAGE_SIZE = 100  # GetProducts' MaxResults bound


def filters(region: str) -> list[dict[str, str]]:
    return [
        {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
        {"Type": "CONTAINS", "Field": "usagetype", "Value": "-Train:"},
    ]


def parse(entry: str | dict, region: str, read: str) -> CachedPrice | None:
    """One ``PriceList`` entry (a JSON string) as a cached price; None for one that is not on-demand
    training in USD per hour."""
    item = entry if isinstance(entry, dict) else json.loads(entry)
    product = item.get("product", {})
    attributes = product.get("attributes", {})
    if attributes.get("regionCode", region) != region:
        return None
    match = TRAINING_USAGE.match(attributes.get("usagetype", ""))
    if not match:
        return None
    for term in item.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if usd is None or not str(dimension.get("unit", "")).lower().startswith("hr"):
                continue
            price = float(usd)
            if price <= 0:
                continue
            return CachedPrice(
                region=region,
                instance=match.group(1),
                price_per_hour=price,
                currency="USD",
                sku=product.get("sku", term.get("sku", "")),
                usagetype=attributes["usagetype"],
                effective=term.get("effectiveDate", ""),
                publication=item.get("publicationDate", ""),
                read=read,
            )
    return None


def read_prices(client: Any, region: str, *, now: dt.datetime | None = None) -> list[CachedPrice]:
    """Every on-demand training price in ``region``, page by page; the latest effective one per instance."""
    read = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    found: dict[str, CachedPrice] = {}
    request: dict[str, Any] = {
        "ServiceCode": SERVICE_CODE,
        "Filters": filters(region),
        "FormatVersion": "aws_v1",
        "MaxResults": PAGE_SIZE,
    }
    with aws_errors("read SageMaker prices from the AWS Price List API"):
        while True:
            page = client.get_products(**request)
            for entry in page.get("PriceList", []):
                price = parse(entry, region, read)
                if price is not None and (
                    price.instance not in found or price.effective > found[price.instance].effective
                ):
                    found[price.instance] = price
            if not page.get("NextToken"):
                break
            request["NextToken"] = page["NextToken"]
    if not found:
        raise StartError(
            f"AWS's price list has no on-demand SageMaker training price in {region} "
            f"(GetProducts {SERVICE_CODE}, regionCode {region}, usage type *-Train:ml.*)"
        )
    return sorted(found.values(), key=lambda p: p.instance)


def pricing_client(*, endpoint_url: str | None = None, profile: str | None = None) -> Any:
    """The Price List API's client, in us-east-1 whatever the prices' region."""
    return aws_client("pricing", region=PRICING_REGION, endpoint_url=endpoint_url, profile=profile)
