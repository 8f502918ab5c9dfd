"""`tiered-training prices`: SageMaker training prices from AWS's Price List API into the user's cache, and
the plans that use them, with their source and dates.

The Price List API is answered by botocore's Stubber (moto lacks it): every request and response is
checked against botocore's service model of ``pricing`` (2017-10-15), and a call nobody expected fails.
The cache directory is each test's own (tests/conftest.py sets XDG_CACHE_HOME).
"""

from __future__ import annotations

import json
import re

import botocore.session
import pytest
from botocore.stub import Stubber
from support import RECIPES, recipe_dict, run_cli, unwrapped, write_yaml

from tiered_training import catalog as catalogs
from tiered_training.aws import prices as price_list
from tiered_training.catalog import price_cache
from tiered_training.planning.planner import plan_file

B200, P5 = "ml.p6-b200.48xlarge", "ml.p5.48xlarge"
PUBLISHED = "2026-11-20T18:03:11Z"


def entry(usagetype: str, price: str, sku: str, region: str = "us-east-1", unit: str = "Hrs") -> str:
    """One PriceList entry as the API sends it: a JSON string."""
    term = f"{sku}.JRTCKXETXF"
    return json.dumps(
        {
            "product": {
                "productFamily": "ML Instance",
                "attributes": {"regionCode": region, "usagetype": usagetype, "servicecode": "AmazonSageMaker"},
                "sku": sku,
            },
            "serviceCode": "AmazonSageMaker",
            "terms": {
                "OnDemand": {
                    term: {
                        "offerTermCode": "JRTCKXETXF",
                        "sku": sku,
                        "effectiveDate": "2026-11-01T00:00:00Z",
                        "priceDimensions": {
                            f"{term}.6YS6EN2CT7": {
                                "unit": unit,
                                "pricePerUnit": {"USD": price},
                                "description": f"${price} per hour",
                            }
                        },
                    }
                }
            },
            "version": "20261120180311",
            "publicationDate": PUBLISHED,
        }
    )


def request(region: str, token: str | None = None) -> dict:
    params = {
        "ServiceCode": "AmazonSageMaker",
        "Filters": [
            {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
            {"Type": "CONTAINS", "Field": "usagetype", "Value": "-Train:"},
        ],
        "FormatVersion": "aws_v1",
        "MaxResults": 100,
    }
    return params | ({"NextToken": token} if token else {})


@pytest.fixture
def price_api(monkeypatch):
    """A real pricing client whose answers are the test's, shape-checked by Stubber; the CLI gets it."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = botocore.session.get_session().create_client("pricing", region_name="us-east-1")
    stubber = Stubber(client)
    calls = []

    def pricing_client(**options):
        calls.append(options)
        return client

    monkeypatch.setattr(price_list, "pricing_client", pricing_client)
    with stubber:
        yield stubber
    stubber.assert_no_pending_responses()


def answer(stubber: Stubber, region: str = "us-east-1", b200: str = "98.3200000000", p5: str = "55.0400000000"):
    """Two pages: on-demand training for both instances, and what must be left out (spot, a notebook, hours of
    another unit)."""
    prefix = {"us-east-1": "USE1", "eu-west-1": "EU"}[region]
    stubber.add_response(
        "get_products",
        {
            "FormatVersion": "aws_v1",
            "PriceList": [
                entry(f"{prefix}-Train:{B200}", b200, "B200SKU", region),
                entry(f"{prefix}-Train-Spot:{B200}", "30.0", "SPOTSKU", region),
                entry(f"{prefix}-Notebook:ml.t3.medium", "0.05", "NBSKU", region),
            ],
            "NextToken": "page-2",
        },
        request(region),
    )
    stubber.add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "PriceList": [entry(f"{prefix}-Train:{P5}", p5, "P5SKU", region)]},
        request(region, "page-2"),
    )


def test_prices_reads_the_training_prices_and_caches_them_with_sku_and_dates(price_api):
    answer(price_api)
    result = run_cli("prices", "--region", "us-east-1")
    assert result.returncode == 0, result.stderr
    assert "$98.32/h" in result.stdout and "$55.04/h" in result.stdout and "B200SKU" in result.stdout
    assert "read from AWS's price list" in result.stdout
    cached = json.loads(price_cache.cache_path().read_text())["regions"]["us-east-1"]
    assert set(cached) == {B200, P5}  # not spot, not the notebook
    b200 = cached[B200]
    assert (b200["price_per_hour"], b200["currency"], b200["sku"]) == (98.32, "USD", "B200SKU")
    assert (b200["effective"], b200["publication"], b200["usagetype"]) == (
        "2026-11-01T00:00:00Z",
        PUBLISHED,
        f"USE1-Train:{B200}",
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", b200["read"])
    # Cached: the next call answers from the cache, with no request (Stubber has none queued).
    again = run_cli("prices", "--region", "us-east-1", "-f", "json")
    assert again.returncode == 0, again.stderr
    assert {p["instance"]: p["price_per_hour"] for p in json.loads(again.stdout)["prices"]} == {B200: 98.32, P5: 55.04}


def test_prices_refresh_rewrites_the_region_and_keeps_the_others(price_api):
    answer(price_api)
    answer(price_api, "eu-west-1", b200="120.0")
    assert run_cli("prices", "--region", "us-east-1").returncode == 0
    assert run_cli("prices", "--region", "eu-west-1").returncode == 0
    answer(price_api, b200="101.5")
    result = run_cli("prices", "--region", "us-east-1", "--refresh")
    assert result.returncode == 0, result.stderr
    regions = json.loads(price_cache.cache_path().read_text())["regions"]
    assert regions["us-east-1"][B200]["price_per_hour"] == 101.5
    assert regions["eu-west-1"][B200]["price_per_hour"] == 120.0


def test_an_api_error_is_one_line_and_leaves_the_cache_alone(price_api):
    price_api.add_client_error(
        "get_products",
        "AccessDeniedException",
        "User is not authorized to perform: pricing:GetProducts",
        400,
        expected_params=request("us-east-1"),
    )
    result = run_cli("prices", "--region", "us-east-1")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: cannot read SageMaker prices from the AWS Price List API: AccessDeniedException: "
        "User is not authorized to perform: pricing:GetProducts"
    )
    assert not price_cache.cache_path().exists()


def test_a_region_with_no_training_prices_is_an_error_not_an_empty_cache(price_api):
    price_api.add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "PriceList": [entry("USE1-Notebook:ml.t3.medium", "0.05", "NB")]},
        request("us-east-1"),
    )
    result = run_cli("prices", "--region", "us-east-1")
    assert result.returncode == 1 and "no on-demand SageMaker training price in us-east-1" in result.stderr
    assert not price_cache.cache_path().exists()


def test_prices_refuses_an_unknown_region_before_any_call(price_api):
    result = run_cli("prices", "--region", "eu-moon-1")
    assert result.returncode == 2 and "did you mean 'eu-south-1'?" in result.stderr


# -- the plans that use the cache ---------------------------------------------------------


@pytest.fixture
def cached(price_api):
    answer(price_api)
    assert run_cli("prices", "--region", "us-east-1").returncode == 0
    return price_cache.load()["us-east-1"]


def test_a_cached_price_appears_in_plan_and_explain_with_its_source_and_dates(cached, tmp_path):
    path = write_yaml(tmp_path / "recipe.yaml", recipe_dict())
    data = json.loads(run_cli("plan", "-f", "json", path).stdout)["plans"][0]["estimates"]
    assert data["price_per_hour"] == 98.32
    assert data["cost_usd"] == pytest.approx(data["wall_time_hours"] * 98.32)
    source = data["price_source"]
    assert source.startswith("AWS Price List API (pricing:GetProducts, AmazonSageMaker), us-east-1, SKU B200SKU")
    assert "effective 2026-11-01" in source and "published 2026-11-20" in source
    assert re.search(r"read \d{4}-\d\d-\d\d", source)
    explained = unwrapped(run_cli("explain", path).stdout)
    assert re.search(r"cost +\$[\d,]+ at \$98\.32 per node-hour \(AWS Price List API .*effective 2026-11-01", explained)
    # The recipe's own price still comes first; a region the cache lacks has no price.
    own = json.loads(
        run_cli(
            "plan", "-f", "json", write_yaml(tmp_path / "own.yaml", recipe_dict(**{"compute.price_per_hour": 90.0}))
        ).stdout
    )["plans"][0]["estimates"]
    assert (own["price_per_hour"], own["price_source"]) == (90.0, "recipe compute.price_per_hour")
    elsewhere = json.loads(
        run_cli(
            "plan", "-f", "json", write_yaml(tmp_path / "eu.yaml", recipe_dict(**{"compute.region": "eu-west-1"}))
        ).stdout
    )["plans"][0]["estimates"]
    assert elsewhere["cost_usd"] is None and "tiered-training prices --region eu-west-1" in elsewhere["price_source"]


def test_the_synth_table_shows_every_cost_with_its_source_and_dates(cached):
    """`make synth` prints `tiered-training plan recipes/`: with a cached price, every template has a cost."""
    result = run_cli("plan", "recipes/")
    assert result.returncode == 0, result.stderr
    assert "no price" not in result.stdout
    joined = result.stdout.replace("\n  ", " ")  # a note wraps at spaces, its lines after the first indented
    notes = [line for line in joined.splitlines() if line.startswith("cost of ")]
    named = {name for line in notes for name in line.split(":", 1)[0].removeprefix("cost of ").split(", ")}
    assert len(named) == len(RECIPES)
    for line in notes:
        assert re.search(
            r": (\$(98\.32|55\.04)|spot estimate \$[\d.]+) per node-hour, AWS Price List API \(pricing:GetProducts, AmazonSageMaker\), "
            r"us-east-1, SKU (B200|P5)SKU, effective 2026-11-01, published 2026-11-20, read \d{4}-\d\d-\d\d",
            line,
        ), line
        assert ("spot estimate" in line) == ("spot range: an estimate: on-demand less" in line), line


def test_spot_is_a_labelled_range_around_the_estimate(cached, tmp_path):
    path = write_yaml(tmp_path / "spot.yaml", recipe_dict(**{"compute.spot": True}))
    estimates = json.loads(run_cli("plan", "-f", "json", path).stdout)["plans"][0]["estimates"]
    low_saving, high_saving = catalogs.spot_savings()
    node_hours = estimates["wall_time_hours"]
    low, high = estimates["spot_cost_usd_range"]
    assert low == pytest.approx(node_hours * 98.32 * (1 - high_saving))
    assert high == pytest.approx(node_hours * 98.32 * (1 - low_saving))
    assert low < estimates["cost_usd"] <= high and low < high
    assert "spot range: an estimate" in estimates["price_source"] and "instances.yaml" in estimates["price_source"]
    assert f"${low:,.0f}-${high:,.0f} spot est." in run_cli("plan", "--wide", path).stdout
    assert f"~${low:,.0f}-${high:,.0f}" in run_cli("plan", path).stdout
    assert f"spot cost (estimate)   ${low:,.0f}-${high:,.0f}" in run_cli("explain", path).stdout
    # On demand, a plan has no range.
    on_demand = json.loads(run_cli("plan", "-f", "json", write_yaml(tmp_path / "od.yaml", recipe_dict())).stdout)
    assert "spot_cost_usd_range" not in on_demand["plans"][0]["estimates"]


def test_without_a_cache_the_plan_says_how_to_get_a_price(tmp_path):
    assert not price_cache.cache_path().exists()
    path = write_yaml(tmp_path / "recipe.yaml", recipe_dict())
    result = run_cli("plan", path)
    text = " ".join(result.stdout.split())  # notes wrap at spaces
    assert result.returncode == 0 and "no price for" in text
    assert (
        f"no published SageMaker training price for {B200} in us-east-1 in the catalogue" in text
        and "run `tiered-training prices --region us-east-1` to read AWS's price list" in text
    )


def test_an_unreadable_cache_is_said_and_refresh_rewrites_it(price_api, tmp_path):
    price_cache.cache_path().parent.mkdir(parents=True, exist_ok=True)
    price_cache.cache_path().write_text("{not json")
    path = write_yaml(tmp_path / "recipe.yaml", recipe_dict())
    source = json.loads(run_cli("plan", "-f", "json", path).stdout)["plans"][0]["estimates"]["price_source"]
    assert f"the price cache {price_cache.cache_path()} is unreadable" in source
    refused = run_cli("prices", "--region", "us-east-1")
    assert refused.returncode == 1 and "pass --refresh" in refused.stderr
    answer(price_api)
    assert run_cli("prices", "--region", "us-east-1", "--refresh").returncode == 0
    assert price_cache.load()["us-east-1"][B200].price_per_hour == 98.32


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf", ""])
def test_a_bad_price_variable_is_an_error_naming_it_and_what_is_valid(monkeypatch, tmp_path, value):
    variable = "TIERED_TRAINING_PRICE_ML_P6_B200_48XLARGE"
    monkeypatch.setenv(variable, value)
    path = write_yaml(tmp_path / "recipe.yaml", recipe_dict())
    other = write_yaml(tmp_path / "other.yaml", recipe_dict(**{"sequence_length": 2048}))
    for args in (("plan", path), ("explain", path), ("diff", path, other), ("instances",)):
        result = run_cli(*args)
        assert result.returncode == 2, (args, result.stdout)
        assert (
            f"environment {variable}={value!r}: not a price; give US dollars per instance-hour, a number above 0"
            in result.stderr
        ), (args, result.stderr)
        assert "Traceback" not in result.stderr
    # Unused where the recipe sets its own price.
    priced = write_yaml(tmp_path / "priced.yaml", recipe_dict(**{"compute.price_per_hour": 90.0}))
    assert run_cli("plan", priced).returncode == 0
    monkeypatch.setenv(variable, "97.5")
    assert json.loads(run_cli("plan", "-f", "json", path).stdout)["plans"][0]["estimates"]["price_per_hour"] == 97.5


def test_diff_shows_each_cost_with_its_source(cached):
    old, new = "recipes/llama3-8b-fp8.yaml", "recipes/llama3-8b-fp8-p5.yaml"  # B200 against P5
    result = json.loads(run_cli("diff", "-f", "json", old, new).stdout)["diffs"][0]
    cost, sources = result["metrics"]["cost_usd"], result["price_source"]
    assert cost["old"] > 0 and cost["new"] > 0 and cost["delta"] == pytest.approx(cost["new"] - cost["old"])
    assert "SKU B200SKU" in sources["old"] and "SKU P5SKU" in sources["new"]
    text = unwrapped(run_cli("diff", old, new).stdout)
    assert re.search(r"^  old price: AWS Price List API .*SKU B200SKU, effective 2026-11-01", text, re.M)
    assert re.search(r"^  new price: AWS Price List API .*SKU P5SKU, effective 2026-11-01", text, re.M)
    same = run_cli("diff", "-f", "markdown", old, old).stdout
    assert "price: AWS Price List API" in same and "old price" not in same


def test_planning_reads_the_cache_and_loads_no_aws_sdk(cached, tmp_path):
    """The planner stays offline: a plan priced from the cache, in a fresh process, imports neither boto3 nor
    botocore."""
    import os
    import subprocess
    import sys

    from support import ROOT

    code = (
        "import sys\n"
        "from tiered_training.planning.planner import plan_file\n"
        f"plan = plan_file({str(RECIPES[0])!r})\n"
        "print(plan.estimates.price_per_hour, sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=os.environ)
    assert result.returncode == 0, result.stderr
    instance = plan_file(RECIPES[0]).instance.name
    assert result.stdout == f"{cached[instance].price_per_hour} []\n"


def test_the_price_list_client_is_us_east_1s_whatever_the_prices_region(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    client = price_list.pricing_client()
    assert client.meta.region_name == "us-east-1" and client.meta.service_model.api_version == "2017-10-15"
    assert client.meta.endpoint_url == "https://api.pricing.us-east-1.amazonaws.com"
