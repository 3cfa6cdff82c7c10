"""The content check (loadtest.content): loops are caught, text is not, on real token streams."""

from __future__ import annotations

from deploy.embedded_pair import heldout_tokens
from loadtest import content


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
    assert ref == {"distinct_4": 1.0, "source": "the workload's prompts"}
    short = [content.figures(list(range(64)), [1, 2, 3])]
    assert content.reference_for(short) is None
    assert content.reference_for(short, embedded=True)["source"] == "the embedded pair's held-out code"


def test_a_summary_splits_acceptance_and_speed_by_content() -> None:
    figs = [content.figures(list(range(64))), content.figures([9] * 64), None]
    spec = [{"num_draft_tokens": 100, "num_accepted_draft_tokens": 40},
            {"num_draft_tokens": 100, "num_accepted_draft_tokens": 95}, None]
    s = content.summarize(figs, None, spec, [10.0, 30.0, 5.0])
    assert (s["checked"], s["degenerate"], s["degenerate_share"]) == (2, 1, 0.5)
    assert (s["acceptance_valid"], s["acceptance_degenerate"]) == (0.4, 0.95)
    assert (s["tokens_per_s_valid"], s["tokens_per_s_degenerate"]) == (10.0, 30.0)
    assert "rests mostly on degenerate output" in content.warning(s)
    clean = content.summarize(figs[:1], {"distinct_4": 0.9, "source": "x"})
    assert content.warning(clean) is None and clean["like_reference"]
    merged = content.merge([s, clean])
    assert (merged["checked"], merged["degenerate"]) == (3, 1)
    assert content.warning(merged).startswith("33% of its requests are degenerate")
