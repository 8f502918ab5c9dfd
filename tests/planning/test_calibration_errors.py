"""A calibration row that cannot be read is one line naming its file, line and field (make calibrate), never a
traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from tiered_training import catalog
from tiered_training.planning import calibration

SOURCE = catalog.CATALOG_DIR / "calibration.yaml"


@pytest.fixture
def catalogue(tmp_path, monkeypatch):
    for path in catalog.CATALOG_DIR.glob("*.yaml"):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.setattr(catalog, "CATALOG_DIR", tmp_path)
    return tmp_path / "calibration.yaml"


def _add_to_row(path, row_id: str, line: str) -> int:
    """Insert ``line`` as a field of the row ``row_id``; the row's first line number."""
    lines = path.read_text().splitlines(keepends=True)
    start = next(i for i, text in enumerate(lines) if text.strip() == f"- id: {row_id}")
    lines.insert(start + 1, f"    {line}\n")
    path.write_text("".join(lines))
    return start + 1


def test_an_unknown_field_names_file_line_row_and_field(catalogue, capsys):
    row = calibration.load(gpu_dir=None).rows[3]
    line = _add_to_row(catalogue, row.id, "tokens_per_secnd: 1000")
    assert calibration.main(["--no-fit", "--no-loso", "--gpu-dir", str(catalogue.parent / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {catalogue}:{line}: rows[3] ({row.id}): tokens_per_secnd: Extra inputs are not permitted"


def test_a_wrong_value_names_its_field(catalogue):
    row = calibration.load(gpu_dir=None).rows[0]
    lines = catalogue.read_text().splitlines(keepends=True)
    start = next(i for i, text in enumerate(lines) if text.strip() == f"- id: {row.id}")
    at = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("gpus:"))
    lines[at] = "    gpus: eight\n"
    catalogue.write_text("".join(lines))
    with pytest.raises(calibration.CalibrationError) as raised:
        calibration.load(gpu_dir=None)
    assert str(raised.value).startswith(f"{catalogue}:{start + 1}: rows[0] ({row.id}): gpus: Input should be a valid integer")


def test_a_bad_gpu_check_names_its_file(catalogue, tmp_path):
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    (gpu / "check.json").write_text(json.dumps({"rows": [{"id": "x", "framework": "tiered-training"}]}))
    with pytest.raises(calibration.CalibrationError, match=r"check.json: rows\[0\] \(x\): source: Field required"):
        calibration.load(gpu_dir=gpu)
    (gpu / "check.json").write_text("{not json")
    with pytest.raises(calibration.CalibrationError, match=r"check.json: not a GPU check's JSON"):
        calibration.load(gpu_dir=gpu)
