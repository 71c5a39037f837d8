"""The progress display: a count without a total shows every step as it starts."""

import io

from npusim.progress import progress_bar


def test_a_count_draws_every_call_at_once():
    """serve's engine steps come in bursts of short ones before a long one: the count and
    the step under way must be on screen while that one runs, not held back by tqdm's
    throttling until the next call."""
    out = io.StringIO()
    bar = progress_bar("serve", "engine steps", force=True, stream=out)
    for i in range(1, 51):
        bar(i, None, note=f"prefill {i} x 512")
    drawn = out.getvalue()  # before close(), which would draw the last state anyway
    bar.close()
    assert "serve: 50 engine steps" in drawn and "prefill 50 x 512" in drawn
