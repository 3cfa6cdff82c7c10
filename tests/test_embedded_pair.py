"""The embedded pair: shipped trained weights, built into a cost-faithful and a plumbing target that
predict the same tokens, and a recipe that still reproduces the shipped weights' quality."""

from __future__ import annotations

import json

import pytest
import torch

from models.embedded_pair import GOALS, WEIGHTS, Serving
from models.pair_training import train
from models.recipe import RECIPE, recipe_hash


def _logits(folder, ids: torch.Tensor) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_both_served_targets_predict_what_the_shipped_one_does(embedded_pair) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_pair.target)
    ids = torch.tensor([tok("import os\nimport sys\n\n\ndef main(argv):\n    for name in argv:\n").input_ids])
    trained = _logits(WEIGHTS / "target", ids)
    # bf16: widening divides input columns by the copies (6 is not a power of two), and bf16 rounds
    # the quotients: logits (up to ~17) move by a few hundredths, the distributions by KL ~1e-5.
    tolerance = 0.1 if Serving().serve_dtype == "bfloat16" else 1e-4
    for folder in (embedded_pair.target, embedded_pair.plumbing_target):
        served = _logits(folder, ids)
        assert torch.allclose(served, trained, atol=tolerance, rtol=tolerance), folder
        kl = torch.nn.functional.kl_div(served.log_softmax(-1), trained.log_softmax(-1), log_target=True,
                                        reduction="sum") / ids.shape[1]
        assert kl < 1e-3, (folder, kl)
    report = embedded_pair.report
    serving = Serving()
    assert report["serving"]["target_copies"] == serving.target_copies and report["serving"]["plumbing_copies"] == 2
    # The plumbing target costs a fraction of the cost-faithful one: its weights grow at least as fast
    # as the copies (the layers' with their square), on any CPU kind (3 copies in float32, 6 in bf16).
    assert report["params"]["plumbing_target"] * serving.target_copies / serving.plumbing_copies \
        < report["params"]["target"]
    # The served pair comes from the shipped weights, and the shipped weights from the code's recipe.
    assert report["training"] == json.loads((WEIGHTS / "training.json").read_text())
    assert report["training"]["recipe_hash"] == recipe_hash(RECIPE), \
        "the recipe changed since the weights were trained: `make models REBUILD=1` and commit models/embedded_weights"
    assert report["heldout"]["greedy_agreement"] >= GOALS["greedy_agreement"][0]
    # The served pair is evaluated as the goals read it: bits per byte on the held-out code.
    assert 0.3 < report["heldout"]["target_bits_per_byte"] < 3.0


@pytest.mark.full
def test_the_recipe_retraces_the_start_of_the_shipped_curve(tmp_path, measurement) -> None:
    """`make models REBUILD=1` on this machine, its first 400 steps (about 16 min on 2 cores): the
    held-out curve of a run anew follows the shipped one (same recipe, same batches; bf16 and BLAS
    rounding on another CPU move the last digits, not the curve)."""
    shipped = json.loads((WEIGHTS / "training.json").read_text())
    again = train(RECIPE, tmp_path / "weights", stop_after=400)
    assert again["recipe_hash"] == shipped["recipe_hash"]
    ours = dict(map(tuple, again["train"]["target"]["heldout_bpb_curve"]))
    theirs = dict(map(tuple, shipped["train"]["target"]["heldout_bpb_curve"]))
    assert sorted(ours) == [200, 400]
    for step, bpb in ours.items():
        assert bpb == pytest.approx(theirs[step], rel=0.03), f"step {step}: {bpb} against the shipped {theirs[step]}"
