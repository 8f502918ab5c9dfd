"""The calibration's pieces, each fast: what ``make calibrate`` prints for the stored parameters,
the leave-one-source-out table and summary, which free parameters each row informs, the
simplex method, the parameter transforms, short fits and short leave-one-source-out refits, and
``--write``'s file.

What a user reads (the report, the table, the stored summary) is compared with the reviewed copy
in ``tests/golden/calibration.json``; ``make snapshots`` (``UPDATE_GOLDEN=1``) rewrites it. Floats
are compared to 6 significant digits: the fit runs ``log`` and ``exp`` of the C library, whose last
digit may differ between machines. The two full refits (about 10 s) are in ``test_perf.py``.

Each test loads the calibration itself (no shared fixture): mutation testing
(``scripts/mutation.py``) records which test reaches which function."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from support import rounded

from tiered_training import catalog as catalogs
from tiered_training.planning import calibration, memory, perf
from tiered_training.planning.perf import step_time

GOLDEN = Path(__file__).parents[1] / "golden" / "calibration.json"
MEGATRON = "Megatron-Bridge"


def _stored():
    model = catalogs.performance_model()
    return perf.parameters_of(model), dict(model.calibration_only)


def _source(cal: calibration.Calibration, title: str) -> str:
    return next(k for k in calibration.sources(cal) if title in k)


def _params(params, factors) -> dict:
    return {"params": asdict(params), "factors": factors}


def _loso_rows(results) -> list:
    return [[r.row.id, r.predicted, r.memory_gib] for r in results]


def _report(capsys) -> list[str]:
    assert calibration.main(["--no-fit", "--no-loso"]) == 0
    return capsys.readouterr().out.splitlines()


def _compute(capsys) -> dict:
    cal = calibration.load()
    params, factors = _stored()
    results = calibration.evaluate(cal, params, factors)
    return {
        "report": _report(capsys),
        "loso_table": calibration.loso_table(cal, results).splitlines(),
        "summary": calibration.summary(cal, results),
        "informed": {r.id: sorted(calibration._informed([r], [], cal)) for r in cal.rows}
        | {r.id: sorted(calibration._informed([], [r], cal)) for r in cal.linear_rows},
        "quick_fit": _params(*calibration.fit(cal, iterations=3)),
        "quick_fit_without_megatron": _params(*calibration.fit(cal, without=_source(cal, MEGATRON), iterations=3)),
        "quick_loso": _loso_rows(calibration.leave_one_source_out(cal, iterations=2)),
        "quick_calibrate": _quick_calibrate(capsys, Path(os.environ["UPDATE_GOLDEN_TMP"])),
        "help": _help(capsys),
    }


def _help(capsys) -> list[str]:
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as exit_info:
        patch.setenv("COLUMNS", "100")  # argparse wraps to the terminal's width
        calibration.main(["--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out.splitlines()


def _quick_calibrate(capsys, tmp_path: Path) -> dict:
    """``make calibrate`` (``--write``) with fits of two iterations, on a copy of the catalogue:
    what it prints, and the ``performance.yaml`` it writes."""
    shutil.copytree(catalogs.CATALOG_DIR, tmp_path / "catalog")
    fit, loso = calibration.fit, calibration.leave_one_source_out
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(catalogs, "CATALOG_DIR", tmp_path / "catalog")
        patch.setattr(calibration, "fit", lambda cal, model=None, *, without=None, iterations=0: fit(cal, model, without=without, iterations=2))
        patch.setattr(calibration, "leave_one_source_out", lambda cal, model=None: loso(cal, model, iterations=1))
        capsys.readouterr()
        assert calibration.main(["--write"]) == 0
        out = capsys.readouterr()
    return {"stdout": out.out.replace(str(tmp_path), "TMP").splitlines(), "stderr": out.err.splitlines(),
            "performance.yaml": (tmp_path / "catalog" / "performance.yaml").read_text().splitlines()}


@functools.cache
def _golden_copy() -> dict:
    """The reviewed copy, read once."""
    assert GOLDEN.exists(), "tests/golden/calibration.json is missing: make snapshots writes it"
    return json.loads(GOLDEN.read_text())


def _golden(key: str):
    return _golden_copy()[key]


def test_update_golden(capsys, tmp_path, monkeypatch):
    """Under UPDATE_GOLDEN (``make snapshots``), writes the reviewed copy; otherwise checks it names every part."""
    if os.environ.get("UPDATE_GOLDEN"):
        monkeypatch.setenv("UPDATE_GOLDEN_TMP", str(tmp_path))
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(_compute(capsys), indent=1, sort_keys=True) + "\n")
        _golden_copy.cache_clear()
    assert set(_golden_copy()) == {"report", "loso_table", "summary", "informed", "quick_fit",
                                                "quick_fit_without_megatron", "quick_loso", "quick_calibrate", "help"}


# -- what make calibrate prints ---------------------------------------------------------------


def test_the_report_of_the_stored_parameters_is_the_reviewed_one(capsys):
    """Every row's published and predicted throughput and memory, the single-Linear speed-ups, the
    stored parameters and the count of published and own rows, as ``make calibrate --no-fit`` prints them."""
    assert _report(capsys) == _golden("report")


def test_the_leave_one_source_out_table_groups_rows_by_source():
    cal = calibration.load()
    results = calibration.evaluate(cal, *_stored())
    assert calibration.loso_table(cal, results).splitlines() == _golden("loso_table")


def test_the_summary_separates_published_rows_from_this_containers_runs():
    cal = calibration.load()
    results = calibration.evaluate(cal, *_stored())
    got = calibration.summary(cal, results)
    assert got == _golden("summary")
    published = [abs(r.error) for r in results if r.row.published]
    assert got["loso_published_worst_error"] == round(max(published), 4)
    assert got["rows"] == got["published_rows"] + got["own_rows"] == len(cal.rows)


def test_an_error_is_relative_to_the_published_figure():
    cal = calibration.load()
    row = next(r for r in cal.rows if r.peak_memory_gib_reserved is not None)
    result = calibration.Result(row, predicted=1.25 * row.tokens_per_second_per_gpu, memory_gib=0.5 * row.peak_memory_gib_reserved)
    assert result.error == pytest.approx(0.25) and result.memory_error == pytest.approx(-0.5)
    assert calibration.Result(row, 1.0, None).memory_error is None
    unpublished = next(r for r in cal.rows if r.peak_memory_gib_reserved is None)
    assert calibration.Result(unpublished, 1.0, 10.0).memory_error is None


def test_median_and_worst_are_of_absolute_errors():
    assert calibration._median_worst([0.1, -0.3, 0.2]) == (0.2, 0.3)
    assert calibration._median_worst([0.123456, -0.5]) == (0.3117, 0.5)
    assert calibration._median_worst([]) == (None, None)


# -- which parameters a row informs ----------------------------------------------------------


def test_each_row_informs_the_parameters_its_prediction_uses():
    cal = calibration.load()
    informed = {r.id: sorted(calibration._informed([r], [], cal)) for r in cal.rows}
    informed |= {r.id: sorted(calibration._informed([], [r], cal)) for r in cal.linear_rows}
    assert informed == _golden("informed")
    # What the golden copy holds, said plainly for a few kinds of row.
    cp = next(r for r in cal.rows if r.context_parallel > 1)
    assert "ring_step_overhead" in informed[cp.id]
    eager_fp8 = next(r for r in cal.rows if not r.compile and r.precision == "fp8")
    assert "fp8_eager_cast_factor" in informed[eager_fp8.id]
    # this container's eager rows run its own decoder, counted op by op: they do not inform the factor fitted on
    # other frameworks' eager Llama kernels, which a published eager Llama row does
    assert not eager_fp8.published and "eager_memory_factor" not in informed[eager_fp8.id]
    titan_eager = next(r for r in cal.rows if r.framework == "torchtitan" and not r.compile)
    assert "eager_memory_factor" in informed[titan_eager.id]
    assert "fp8_cast_factor" not in informed[eager_fp8.id]  # eager casts are counted, not the compiled ones
    megatron = next(r for r in cal.rows if r.framework == "megatron-te")
    assert "megatron_te" in informed[megatron.id]
    assert calibration._informed([], [], cal) == {"gemm_efficiency", "attention_efficiency"}


# -- the simplex method and the transforms ---------------------------------------------------


def _rosenbrock(x: list[float]) -> float:
    return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2


def test_nelder_mead_finds_the_minimum_of_a_quadratic_and_of_rosenbrocks_valley():
    quadratic = calibration.nelder_mead(lambda x: (x[0] - 1) ** 2 + 10 * (x[1] + 2) ** 2 + 0.5 * (x[2] - 3) ** 2, [0.0, 0.0, 0.0])
    assert quadratic == pytest.approx([1, -2, 3], abs=1e-4)
    assert calibration.nelder_mead(_rosenbrock, [-1.2, 1.0]) == pytest.approx([1, 1], abs=1e-3)


def test_nelder_mead_follows_the_standard_simplex_steps():
    """Its path, step by step: reflection (1), expansion (2), contraction (1/2) and shrink (1/2)
    each change where a short run ends."""
    calls = []

    def traced(x):
        calls.append(list(x))
        return _rosenbrock(x)

    end = calibration.nelder_mead(traced, [-1.2, 1.0], iterations=40)
    # The first simplex: the start, and one step of 0.3 along each axis.
    assert calls[:3] == [[-1.2, 1.0], [-0.8999999999999999, 1.0], [-1.2, 1.3]]
    assert len(calls) == 77
    assert end == pytest.approx([0.585983, 0.326877], rel=1e-5)
    assert _rosenbrock(end) == pytest.approx(0.198630, rel=1e-5)


def test_nelder_mead_stops_when_the_simplex_is_flat_and_after_its_iterations():
    calls = []
    assert calibration.nelder_mead(lambda x: calls.append(x) or 1.0, [2.0, 3.0]) == [2.0, 3.0]
    assert len(calls) == 3  # the first simplex, then it stops: every score is the same
    calls.clear()
    calibration.nelder_mead(lambda x: calls.append(x) or _rosenbrock(x), [-1.2, 1.0], iterations=1)
    assert len(calls) == 5  # the first simplex, then one iteration: a reflection, then an expansion
    calls.clear()
    calibration.nelder_mead(lambda x: calls.append(x) or _rosenbrock(x), [-1.2, 1.0], iterations=0)
    assert len(calls) == 3


def _table(*values: tuple[tuple[float, float], float]):
    """A function of two variables given at a few points, 5 everywhere else."""
    def f(x):
        return next((v for point, v in values if abs(x[0] - point[0]) < 1e-12 and abs(x[1] - point[1]) < 1e-12), 5.0)
    return f


SHRINKS = [[0, 0], [0.3, 0], [0, 0.3], [0.3, -0.3], [0.075, 0.15], [0.15, 0], [0, 0.15],
           [0.15, -0.15], [0.0375, 0.075], [0.075, 0], [0, 0.075]]


@pytest.mark.parametrize("values, trace", [
    # Reflection and contraction both fail: the simplex shrinks towards its best point, twice.
    ((((0, 0), 0.0), ((0.3, 0), 1.0), ((0, 0.3), 1.0)), SHRINKS),
    # Two points tie for best, or for worst: the simplex is not flat, so it goes on.
    ((((0, 0), 1.0), ((0.3, 0), 1.0), ((0, 0.3), 5.0)), SHRINKS),
    ((((0, 0), 1.0), ((0.3, 0), 5.0), ((0, 0.3), 5.0)), SHRINKS),
    # The expansion is only as good as the reflection: the reflection is kept; then a shrink towards it.
    ((((0, 0), 0.0), ((0.3, 0), 1.0), ((0, 0.3), 1.0), ((0.3, -0.3), -1.0), ((0.45, -0.6), -1.0)),
     [[0, 0], [0.3, 0], [0, 0.3], [0.3, -0.3], [0.45, -0.6], [0, -0.3], [0.225, -0.075], [0.15, -0.15], [0.3, -0.15]]),
    # The reflection only ties the best point: kept without trying an expansion.
    ((((0, 0), 0.0), ((0.3, 0), 1.0), ((0, 0.3), 1.0), ((0.3, -0.3), 0.0)),
     [[0, 0], [0.3, 0], [0, 0.3], [0.3, -0.3], [0, -0.3], [0.225, -0.075], [0.15, -0.15], [0.15, 0]]),
])
def test_nelder_mead_reflects_expands_contracts_and_shrinks_as_the_method_says(values, trace):
    calls = []
    f = _table(*values)
    calibration.nelder_mead(lambda x: calls.append(list(x)) or f(x), [0.0, 0.0], iterations=2)
    assert [v for point in calls for v in point] == pytest.approx([v for point in trace for v in point], abs=1e-12)


def test_nelder_mead_with_no_tolerance_goes_on_while_the_simplex_is_exactly_flat():
    calls = []
    calibration.nelder_mead(lambda x: calls.append(x) or 1.0, [0.0, 0.0], iterations=1, tolerance=0.0)
    assert len(calls) == 7  # the first simplex, a reflection, a contraction, a shrink of two points


def test_each_parameter_is_fitted_in_the_space_of_its_range():
    """Efficiencies and power factors in (0, 1), costs above 0, slowdowns above 1: every value
    the simplex proposes maps back inside the range."""
    names = ["gemm_efficiency", "megatron_te", "fp8_cast_factor", "ring_step_overhead", "eager_memory_factor",
             "fp8_eager_cast_factor", "h100_500w", "recipe_rowwise"]
    transforms = calibration._transforms(names)
    assert [t is calibration._UNIT for t in transforms] == [True, False, False, False, False, False, True, True]
    assert [t is calibration._POSITIVE for t in transforms] == [False, True, True, True, False, True, False, False]
    assert [t is calibration._ABOVE_ONE for t in transforms] == [False, False, False, False, True, False, False, False]
    for (to, back), value in zip(transforms, [0.4, 1.3, 1.5, 0.1, 2.0, 5.0, 0.8, 0.9]):
        assert back(to(value)) == pytest.approx(value, rel=1e-9)
    to_unit, back_unit = calibration._UNIT
    assert to_unit(0.5) == 0.0 and back_unit(0.0) == 0.5 and 0 < back_unit(-30) < back_unit(30) < 1
    to_above, back_above = calibration._ABOVE_ONE
    assert back_above(-30) > 1 and back_above(0.0) == 2.0


def test_unpack_splits_the_model_parameters_from_the_calibration_only_factors():
    model = catalogs.performance_model()
    values = {name: 0.5 + i / 100 for i, name in enumerate(calibration.FITTED)}
    values |= {"recipe_rowwise": 0.8, "recipe_mxfp8": 0.7, "megatron_te": 1.2, "h100_500w": 0.9}
    params, factors = calibration._unpack(values, model.fixed)
    assert {name: getattr(params, name) for name in calibration.FITTED} == {name: values[name] for name in calibration.FITTED}
    assert params.fp8_recipe_efficiency == {"tensorwise": 1.0, "rowwise": 0.8, "mxfp8": 0.7}
    assert factors == {"megatron_te": 1.2, "h100_500w": 0.9}
    assert all(getattr(params, k) == v for k, v in model.fixed.items())


# -- fitting -----------------------------------------------------------------------------------


def test_a_short_fit_ends_where_the_reviewed_one_did():
    """Three iterations from the fixed start: the loss, the weights of the sources, the start and
    the transforms all change where it ends."""
    cal = calibration.load()
    assert rounded(_params(*calibration.fit(cal, iterations=3))) == rounded(_golden("quick_fit"))


def test_a_short_fit_without_a_source_leaves_what_only_it_informs_neutral():
    cal = calibration.load()
    params, factors = calibration.fit(cal, without=_source(cal, MEGATRON), iterations=3)
    assert rounded(_params(params, factors)) == rounded(_golden("quick_fit_without_megatron"))
    assert factors["megatron_te"] == 1.0


def test_a_short_leave_one_source_out_predicts_each_row_from_a_fit_without_its_source():
    cal = calibration.load()
    results = calibration.leave_one_source_out(cal, iterations=2)
    assert [r.row.id for r in results] == [r.id for k in calibration.sources(cal) for r in cal.rows if calibration.source_key(r) == k]
    assert rounded(_loso_rows(results)) == rounded(_golden("quick_loso"))


def test_a_fit_starts_from_the_same_point_whatever_was_fitted_before():
    cal = calibration.load()
    first = calibration.fit(cal, iterations=1)
    calibration.fit(cal, iterations=3)
    assert calibration.fit(cal, iterations=1) == first


# -- loading and writing --------------------------------------------------------------------


def test_rows_with_the_same_id_are_refused(tmp_path):
    cal = calibration.load()
    rows = [cal.rows[-1].model_dump(), cal.rows[-2].model_dump()]
    (tmp_path / "a.json").write_text(json.dumps({"rows": rows}))
    shutil.copy(tmp_path / "a.json", tmp_path / "b.json")
    ids = ", ".join(sorted(r["id"] for r in rows))
    with pytest.raises(calibration.CalibrationError, match=f"calibration rows with the same id: {ids}; give each its own$"):
        calibration.load(gpu_dir=tmp_path)
    assert len(calibration.load(gpu_dir=None).rows) == sum(r.published for r in cal.rows)


def test_a_gpu_check_file_without_rows_adds_none(tmp_path):
    (tmp_path / "empty.json").write_text("{}")
    assert [r.id for r in calibration.load(gpu_dir=tmp_path).rows] == [r.id for r in calibration.load(gpu_dir=None).rows]


@pytest.mark.parametrize("sharding", ["full", "none"])
def test_a_rows_memory_is_the_planners_estimate_of_its_run(sharding):
    """Every field of the row reaches the planner's memory model: a context-parallel rank holds
    its share of the sequence, an unsharded run a group of one."""
    cal = calibration.load(gpu_dir=None)
    base = next(r for r in cal.rows if r.hardware in catalogs.instances())
    row = base.model_copy(update=dict(precision="fp32", activation_checkpointing="none", compile=True, context_parallel=2,
                                      sequence_length=8193, sharding=sharding, shard_group_size=8, micro_batch_size=2,
                                      grad_accum_steps=1, loss_chunk_tokens=None))
    usable = catalogs.instances()[row.hardware].usable_hbm_gib
    expected = memory.estimate(row.architecture, precision="fp32", checkpointing="none", sequence_length=4096, micro_batch=2,
                               shard_group=8 if sharding == "full" else 1, hbm_bytes=int(usable * calibration.GIB),
                               loss_chunk_tokens=None, grad_accum_steps=1, compiled=True)
    assert calibration.predict_memory(row, cal, {}) == expected
    assert calibration.predict_memory_gib(row, cal, {}) == expected.reserved / calibration.GIB


@pytest.mark.parametrize("url, key", [
    # A repository file at any commit or branch is one document, hence one source.
    ("https://github.com/pytorch/torchtitan/blob/0123abc/docs/performance.md", "https://github.com/pytorch/torchtitan/blob/-/docs/performance.md"),
    ("https://github.com/pytorch/torchtitan/blob/main/docs/performance.md", "https://github.com/pytorch/torchtitan/blob/-/docs/performance.md"),
    ("https://github.com/pytorch/torchtitan/tree/v0.1", "https://github.com/pytorch/torchtitan/tree/-"),
    # Anything else is its own address.
    ("https://github.com/pytorch/torchtitan/blob", "https://github.com/pytorch/torchtitan/blob"),
    ("https://github.com/pytorch/torchtitan/issues/1589", "https://github.com/pytorch/torchtitan/issues/1589"),
    ("https://example.com/pytorch/torchtitan/blob/main/a.md", "https://example.com/pytorch/torchtitan/blob/main/a.md"),
])
def test_a_source_is_its_document(url, key):
    row = calibration.load(gpu_dir=None).rows[0]
    assert calibration.source_key(row.model_copy(update={"source": calibration.Source(url=url, title="a title")})) == key
    assert calibration.source_key(row.model_copy(update={"source": url})) == key  # a bare address
    assert calibration.source_key(row.model_copy(update={"source": url, "framework": "tiered-training"})) == calibration.OWN_RUNS


def test_an_unknown_machine_is_named(tmp_path):
    cal = calibration.load(gpu_dir=None)
    row = cal.rows[0].model_copy(update={"hardware": "dgx-z9000", "id": "made-up"})
    with pytest.raises(ValueError, match="row made-up: hardware 'dgx-z9000' is neither an instance type nor a system"):
        calibration.hardware(row, cal, {})


def test_a_system_is_its_base_instance_with_its_own_figures():
    cal = calibration.load(gpu_dir=None)
    name, system = next((k, v) for k, v in cal.systems.items() if "like" in v and "gpus_per_node" in v)
    row = next(r for r in cal.rows if r.hardware == name)
    hw, usable = calibration.hardware(row, cal, dict(catalogs.performance_model().calibration_only))
    base = catalogs.instances()[system["like"]]
    assert hw.gpus_per_node == system["gpus_per_node"]
    assert usable == system.get("usable_hbm_gib", base.usable_hbm_gib)
    for key in ("peak_bf16_tflops", "hbm_tbps"):
        if key in system:
            assert getattr(hw, {"peak_bf16_tflops": "peak_bf16_flops", "hbm_tbps": "hbm_bytes_per_s"}[key]) == pytest.approx(
                system[key] * 1e12)


def test_write_stores_the_parameters_and_keeps_the_comments(tmp_path):
    """Writing back the stored parameters and summary gives the file it read, byte for byte."""
    source = catalogs.CATALOG_DIR / "performance.yaml"
    target = tmp_path / "performance.yaml"
    shutil.copy(source, target)
    params, factors = _stored()
    calibration.write_parameters(params, factors, catalogs.performance_model().summary.model_dump(), path=target)
    assert target.read_text() == source.read_text()


def test_make_calibrate_prints_and_writes_what_it_fitted(capsys, tmp_path):
    """The whole command with short fits: the fitted parameters, every row against them and
    against the refit without its source, the held-out table, and the catalogue written."""
    got = _quick_calibrate(capsys, tmp_path)
    golden = _golden("quick_calibrate")
    cal = calibration.load()
    assert got["stderr"] == golden["stderr"] == [f"fitting on {len(cal.rows)} rows ...",
                                                 f"refitting without each of {len(calibration.sources(cal))} sources ..."]
    assert got["stdout"] == golden["stdout"]
    assert got["performance.yaml"] == golden["performance.yaml"]
    assert got["stdout"][-1] == "wrote TMP/catalog/performance.yaml"


def test_write_needs_the_leave_one_source_out_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        calibration.main(["--write", "--no-loso"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m tiered_training.planning.calibration: error: --write and --json store the leave-one-source-out errors: "
        "drop --no-loso")


def test_help_names_every_option(capsys):
    assert _help(capsys) == _golden("help")


@pytest.mark.parametrize("own", [0, 1, None])
def test_the_report_counts_sources_without_this_containers_runs(own, tmp_path, capsys):
    """Published rows and sources apart from this container's runs: none, one, or the committed
    GPU checks (``None``)."""
    cal = calibration.load()
    if own is None:
        assert calibration.main(["--no-fit", "--no-loso"]) == 0
        own = sum(not r.published for r in cal.rows)
    else:
        rows = [r.model_dump() for r in cal.rows if not r.published][:own]
        (tmp_path / "own.json").write_text(json.dumps({"rows": rows}))
        assert calibration.main(["--no-fit", "--no-loso", "--gpu-dir", str(tmp_path)]) == 0
    published = sum(r.published for r in cal.rows)
    sources = len({calibration.source_key(r) for r in cal.rows if r.published})
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"rows: {published} published runs from {sources} sources, plus {own} run{'s' * (own != 1)} of this container "
        "(its GPU checks); all in the fit")


def test_a_framework_the_catalogue_does_not_name_runs_with_pytorch_sdpa_and_no_factor():
    """No framework factor and PyTorch SDPA: the performance model's own prediction, for a published framework's
    code (not this container's decoder and loss)."""
    cal = calibration.load(gpu_dir=None)
    row = next(r for r in cal.rows if r.framework == "megatron-te").model_copy(update={"framework": "made-up"})
    params, factors = _stored()
    hw, _ = calibration.hardware(row, cal, factors)
    expected = step_time(row.architecture, hw, replace(row.setting, attention_kernel="sdpa", container_code=False), sequence_length=row.sequence_length,
                         gpus=row.gpus, accum=row.grad_accum_steps or 1, params=params).tokens_per_second_per_gpu
    assert calibration.predict(row, cal, params, factors) == expected
    assert "megatron_te" not in calibration._informed([row], [], cal)  # no framework factor to fit
    assert calibration.predict_memory_gib(row, cal, factors) == calibration.predict_memory(row, cal, factors).reserved / calibration.GIB


def test_the_rounding_keeps_four_significant_digits():
    assert calibration._round(0.123456) == 0.1235 and calibration._round(1234.5678) == 1235.0
    assert not math.isnan(calibration._round(1e-9))
