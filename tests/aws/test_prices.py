"""The bill: SageMaker training prices by region (catalog/prices.yaml), following compute.region."""

from __future__ import annotations

import json
import re

import pytest
from support import recipe_dict, unwrapped, write_yaml
from typer.testing import CliRunner

from tiered_training import catalog as catalogs
from tiered_training.cli.app import app
from tiered_training.planning.planner import plan_file

B200 = "ml.p6-b200.48xlarge"
# A table of made-up prices in the catalogue's own form, so the tests do not depend on what the
# shipped catalogue holds on a given day.
TABLE = catalogs.Prices(
    source="https://aws.amazon.com/sagemaker-ai/pricing/",
    checked="2026-12-01",
    default_region="us-east-1",
    regions={"us-east-1": {B200: 100.0}, "eu-west-1": {B200: 120.0}},
)


@pytest.fixture
def priced(monkeypatch):
    monkeypatch.setattr(catalogs, "prices", lambda: TABLE)
    monkeypatch.delenv("TIERED_TRAINING_PRICE_ML_P6_B200_48XLARGE", raising=False)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], prog_name="tiered-training", env={"COLUMNS": None})


def test_the_price_catalogue_cites_the_sagemaker_training_page_and_names_known_instances():
    table = catalogs.prices()
    assert table.source.startswith("https://aws.amazon.com/sagemaker")
    assert re.fullmatch(r"[a-z]{2}-[a-z]+-\d", table.default_region)
    instances = set(catalogs.instances())
    for region, prices in table.regions.items():
        assert re.fullmatch(r"[a-z]{2}(-gov)?-[a-z]+-\d", region), region
        assert set(prices) <= instances, (region, set(prices) - instances)
    # The instance catalogue no longer carries a price of its own (one fact, one file).
    assert "price_per_hour" not in catalogs.Instance.model_fields


def test_cost_follows_compute_region(priced, tmp_path):
    home = plan_file(write_yaml(tmp_path / "home.yaml", recipe_dict()))
    assert home.estimates.price_per_hour == 100.0
    assert home.estimates.price_source == "SageMaker training, us-east-1, checked 2026-12-01, https://aws.amazon.com/sagemaker-ai/pricing/"
    ireland = plan_file(write_yaml(tmp_path / "eu.yaml", recipe_dict(**{"compute.region": "eu-west-1"})))
    assert ireland.estimates.price_per_hour == 120.0 and "eu-west-1" in ireland.estimates.price_source
    assert ireland.estimates.cost_usd == pytest.approx(home.estimates.cost_usd * 1.2)
    explained = unwrapped(invoke("explain", tmp_path / "eu.yaml").stdout)
    assert re.search(r"cost +\$[\d,]+ at \$120\.00 per node-hour \(SageMaker training, eu-west-1, checked 2026-12-01, https://", explained)


def test_a_region_without_a_published_price_says_so_and_prints_no_cost(priced, tmp_path):
    path = write_yaml(tmp_path / "mumbai.yaml", recipe_dict(**{"compute.region": "ap-south-1"}))
    plan = plan_file(path)
    assert plan.ok and plan.estimates.cost_usd is None and plan.estimates.price_per_hour is None
    assert f"no published SageMaker training price for {B200} in ap-south-1" in plan.estimates.price_source
    explained = invoke("explain", path)
    assert explained.exit_code == 0
    cost_line = next(line for line in unwrapped(explained.stdout).splitlines() if line.strip().startswith("cost"))
    assert "$" not in cost_line and "ap-south-1" in cost_line and "compute.price_per_hour" in cost_line
    table = invoke("plan", path)
    assert table.exit_code == 0 and "no price" in table.stdout
    data = json.loads(invoke("plan", "-f", "json", path).stdout)
    assert data["plans"][0]["estimates"]["cost_usd"] is None
    # The recipe's own price, or the environment's, still gives a cost there.
    own = plan_file(write_yaml(tmp_path / "own.yaml", recipe_dict(**{"compute.region": "ap-south-1", "compute.price_per_hour": 90.0})))
    assert own.estimates.cost_usd == pytest.approx(own.estimates.wall_time_hours * own.nodes * 90.0)


def test_spot_is_an_estimate_off_the_regional_price_and_absent_without_one(priced, tmp_path):
    on_demand = plan_file(write_yaml(tmp_path / "od.yaml", recipe_dict(**{"compute.region": "eu-west-1"})))
    spot = plan_file(write_yaml(tmp_path / "spot.yaml", recipe_dict(**{"compute.region": "eu-west-1", "compute.spot": True})))
    discount = catalogs.instances()[B200].spot_discount
    assert spot.estimates.cost_usd == pytest.approx(on_demand.estimates.cost_usd * (1 - discount))
    assert "eu-west-1" in spot.estimates.price_source and "(estimate)" in spot.estimates.price_source
    nowhere = plan_file(write_yaml(tmp_path / "none.yaml", recipe_dict(**{"compute.region": "ap-south-1", "compute.spot": True})))
    assert nowhere.estimates.cost_usd is None


def test_diff_with_no_price_on_one_side_has_no_cost_delta(priced, tmp_path):
    old = write_yaml(tmp_path / "old.yaml", recipe_dict())
    new = write_yaml(tmp_path / "new.yaml", recipe_dict(**{"compute.region": "ap-south-1"}))
    result = invoke("diff", "-f", "json", old, new)
    assert result.exit_code == 0, result.output
    cost = json.loads(result.stdout)["diffs"][0]["metrics"]["cost_usd"]
    assert cost["new"] is None and cost["delta"] is None and cost["old"] > 0
    assert invoke("diff", "-f", "markdown", old, new).exit_code == 0 and invoke("diff", old, new).exit_code == 0


def test_instances_lists_the_regional_price_or_a_dash(priced):
    data = json.loads(invoke("instances", "-f", "json").stdout)
    rows = {i["name"]: i for i in data["instances"]}
    assert rows[B200]["price_per_hour"] == 100.0 and "us-east-1" in rows[B200]["price_source"]
    assert rows["ml.p5.48xlarge"]["price_per_hour"] is None and rows["ml.p5.48xlarge"]["spot_price_per_hour"] is None
    assert invoke("instances").exit_code == 0


def test_instances_shows_the_prices_of_a_chosen_region(priced):
    data = json.loads(invoke("instances", "--region", "eu-west-1", "-f", "json").stdout)
    assert data["region"] == "eu-west-1"
    assert {i["name"]: i["price_per_hour"] for i in data["instances"]}[B200] == 120.0
    bad = invoke("instances", "--region", "eu_west_1")
    assert bad.exit_code == 2 and "not an AWS region name" in bad.output
