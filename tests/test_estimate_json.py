"""`estimate --json` carries what the text report prints, field for field, across a matrix of flags: one device and
several (tensor, sequence, pipeline, ZeRO), each checkpoint choice, each framework's saves."""

import json

import pytest

from tinygrad_ckpt.app import cli
from tinygrad_ckpt.units import format_bytes

TINY = ["--layers", "4", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "4", "--vocab", "64"]
CATEGORY_ROWS = {"parameter": "parameters", "gradient": "gradients (both, at once)", "optimizer": "optimizer states",
                 "activation": "activations (saved for backward)", "other": "other (live outputs and inputs)"}


def b(n: int) -> str:
    return f"{format_bytes(n)} ({format_bytes(n, decimal=True)})"


def row(text: str, label: str) -> str:
    """The report's row of `label`: its cells after the label's column (36 characters), each 24 wide."""
    found = [line[38:] if len(label) < 35 else line[4 + len(label):] for line in text.splitlines()
             if line.startswith(f"  {label}  ") or line.startswith(f"  {label}") and len(label) >= 35]
    assert len(found) == 1, (label, text)
    return found[0]


def run(capsys, argv) -> tuple[str, dict]:
    assert cli.main(["estimate", *argv]) == 0
    text = capsys.readouterr().out
    assert cli.main(["estimate", *argv, "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


PARALLEL = [[], ["--tensor-parallel", "2"], ["--tensor-parallel", "2", "--sequence-parallel"],
            ["--pipeline-parallel", "2", "--microbatches", "2"], ["--zero", "2", "--data-parallel", "4"]]


@pytest.mark.parametrize("parallel", PARALLEL, ids=lambda a: " ".join(a) or "one device")
@pytest.mark.parametrize("checkpoint", ["none", "selective", "every_layer"])
@pytest.mark.parametrize("saves", ["engine", "megatron"])
def test_every_json_field_is_what_the_text_prints(capsys, parallel, checkpoint, saves):
    text, out = run(capsys, [*TINY, *parallel, "--checkpoint", checkpoint, "--saves", saves])
    zero = "--zero" in parallel
    for cat, label in CATEGORY_ROWS.items():  # ZeRO: the json's peaks are the shares, the text's second column
        cells = row(text, label)
        assert b(out["peak_bytes_by_category"][cat]) in (cells[24:] if zero else cells[:24]), (cat, cells)
    assert b(out["peak_bytes"]) in row(text, "total peak")
    assert row(text, "parameter gradients").startswith(b(out["parameter_gradient_bytes"]))
    assert row(text, "activation gradients (in flight)").startswith(b(out["activation_gradient_bytes"]))
    assert row(text, "reserved (PyTorch's allocator)").startswith(b(out["reserved_peak_bytes"]))
    measured = "measured (ledger, block 0)" if parallel else "measured (ledger, mean over blocks)"
    assert row(text, measured).split()[0] == f"{out['per_layer_saved_bytes']:,}"
    counted = f"; {out['parameters']:,} parameters)" if parallel else f"parameters: {out['parameters']:,} ("
    assert counted in text and out["model"] in text and all(f"  - {a}" in text for a in out["assumptions"])
    if parallel:
        t2 = out["table_2"]
        assert t2["measured_bytes"] == out["per_layer_saved_bytes"]
        assert row(text, f"K22 Table 2: {t2['formula']}").split()[0] == f"{t2['formula_bytes']:,}"
        assert row(text, "  unexplained").split()[0] == f"{t2['unexplained_bytes']:+,}"
        for label, n in t2["terms"].items():
            assert row(text, f"  {label}").split()[0] == f"{n:+,}"
        assert t2["unexplained_bytes"] == 0 or saves == "engine" and checkpoint == "every_layer"
