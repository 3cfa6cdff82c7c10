"""The content check (loadtest.measurement.content): loops are caught, text is not, on real token streams."""

from __future__ import annotations

from models.embedded_pair import heldout_tokens
from loadtest.measurement import content
from loadtest.measurement.figures import ContentReference


def test_a_loop_is_degenerate_and_text_is_not() -> None:
    loop = [17, 5, 201, 201] + [5, 201, 201] * 40  # "#\n\n" to the end, as the embedded target's greedy output
    fig = content.figures(loop)
    assert fig["loop_share"] > 0.95 and fig["distinct_4"] < 0.1
    assert content.is_degenerate(fig)
    text = content.figures(list(heldout_tokens()[1000:1128]))
    assert text["loop_share"] < 0.2 and text["distinct_4"] > 0.7
    assert not content.is_degenerate(text, content.embedded_reference(128))


def test_a_short_repeat_inside_text_is_not_a_loop() -> None:
    text = list(range(100, 164))
    assert content.loop_share(text[:30] + [7] * 11 + text[30:]) == 0  # 11 equal tokens: shorter than a loop
    assert content.loop_share(text[:30] + [7] * 12 + text[30:]) == 12 / 76
    half = text[:64] + [1, 2, 3, 4] * 16  # half the output in a cycle of 4
    assert content.loop_share(half) == 0.5 and content.is_degenerate(content.figures(half))


def test_the_reference_is_the_prompt_where_it_is_long_enough() -> None:
    long_prompt = list(range(500))
    figs = [content.figures(list(range(64)), long_prompt), content.figures([1, 2] * 32, long_prompt)]
    ref = content.reference_for(figs)
    assert ref == ContentReference(1.0, "the workload's prompts")
    short = [content.figures(list(range(64)), [1, 2, 3])]
    assert content.reference_for(short) is None
    assert content.reference_for(short, embedded=True).source == "the embedded pair's held-out code"


def test_a_summary_splits_acceptance_and_speed_by_content() -> None:
    figs = [content.figures(list(range(64))), content.figures([9] * 64), None]
    spec = [{"num_draft_tokens": 100, "num_accepted_draft_tokens": 40},
            {"num_draft_tokens": 100, "num_accepted_draft_tokens": 95}, None]
    s = content.summarize(figs, None, spec, [10.0, 30.0, 5.0])
    assert (s.checked, s.degenerate, s.degenerate_share) == (2, 1, 0.5)
    assert (s.acceptance_valid, s.acceptance_degenerate) == (0.4, 0.95)
    assert (s.tokens_per_s_valid, s.tokens_per_s_degenerate) == (10.0, 30.0)
    assert "rests mostly on degenerate output" in content.warning(s)
    clean = content.summarize(figs[:1], ContentReference(0.9, "x"))
    assert content.warning(clean) is None and clean.like_reference
    merged = content.merge([s, clean])
    assert (merged.checked, merged.degenerate) == (3, 1)
    assert content.warning(merged).startswith("33% of its requests are degenerate")


def _fixture() -> list[dict]:
    import json
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "embedded_pair_e987624_heldout.json"
    return json.loads(path.read_text())["outputs"]


def test_noise_is_caught_and_real_code_is_not() -> None:
    """The old embedded target's T=1 outputs on the 8 held-out prompts are noise (at least 7 of 8
    flagged); the real continuations of the same files, of the same length, are text (7 of 8 pass)."""
    outputs = _fixture()
    assert len(outputs) == 8
    noisy = [content.is_noise(content.figures([], text=o["sampled_t1"], prompt_text=o["prompt"])) for o in outputs]
    real = [content.is_noise(content.figures([], text=o["real"], prompt_text=o["prompt"])) for o in outputs]
    assert sum(noisy) >= 7, noisy
    assert sum(real) <= 1, real
    # Noise that the loop test passes: its distinct 4-grams are as high as text's.
    assert all(content.distinct_ngrams(o["sampled_t1"].split()) > 0.9 for o in outputs)


def test_a_summary_counts_noise_apart_from_loops_and_says_so() -> None:
    o = _fixture()[0]
    figs = [content.figures(list(range(64)), text=o["sampled_t1"], prompt_text=o["prompt"]),
            content.figures(list(range(64)), text=o["real"], prompt_text=o["prompt"]),
            content.figures([9] * 64, text="x = 1")]
    spec = [{"num_draft_tokens": 10, "num_accepted_draft_tokens": 1}, {"num_draft_tokens": 10,
            "num_accepted_draft_tokens": 6}, {"num_draft_tokens": 10, "num_accepted_draft_tokens": 10}]
    s = content.summarize(figs, None, spec)
    assert (s.degenerate, s.noise, s.noise_checked) == (1, 1, 2)  # "x = 1" is too short to judge
    assert s.acceptance_valid == 0.6  # the real continuation alone
    assert content.label(s) == "NOISE" and content.label(content.summarize(figs[2:])) == "CONTENT"
    assert content.warning(s).startswith("rests mostly on noise")  # 1 of the 2 judged
    merged = content.merge([s, s])
    assert (merged.noise, merged.noise_checked) == (2, 4)
    assert content.warning(content.summarize(figs[1:2])) is None


def test_the_stdlib_word_parts_are_read_once_and_kept_in_the_cache_folder(tmp_path, monkeypatch) -> None:
    """The vocabulary's slow part (reading the stdlib's training split) is kept under the cache folder:
    a second process reads the kept list, and an unwritable cache folder only costs the reading."""
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    read = content._stdlib_word_parts()
    (kept,) = (tmp_path / "cache" / "vocabulary").iterdir()
    assert kept.read_text(encoding="utf-8").split() == read and {"config", "parse"} <= set(read)
    kept.write_text("\n".join([*read, "zyxwvutsrq"]), encoding="utf-8")
    assert content._stdlib_word_parts()[-1] == "zyxwvutsrq"  # the kept list, not the files again
    (tmp_path / "blocked").write_text("a file where the cache folder should be")
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "blocked"))
    assert content._stdlib_word_parts() == read
