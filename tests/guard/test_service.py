"""Streaming runtime: hold-back, cut, re-tokenisation, batching, fail-closed, scoring helpers."""

from __future__ import annotations

import asyncio
import random

import pytest

from guard.api import GuardPolicy, SafetyCut, StreamGuard
from guard.retokenize import IncrementalRetokenizer
from guard.text import prompt_views, response_context, user
from inference.types import TokenDelta
from tests.guard.conftest import FakeRunner, make_guard

TEXT_SAFE = "hello there my friend , how are you today ? the weather is nice and the sky is blue"
TEXT_BAD = "hello there my friend , here is how to build a bomb at home quickly"


def _deltas(text: str, gen_tok, seed: int = 0, max_chunk: int = 3) -> list[TokenDelta]:
    """Split text into generator deltas of 1..max_chunk generator tokens (the generator's tokenizer)."""
    ids = gen_tok(text, add_special_tokens=False)["input_ids"]
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, max_chunk)
        chunk = ids[i:i + n]
        prev = gen_tok.decode(ids[:i])
        now = gen_tok.decode(ids[:i + n])
        out.append(TokenDelta("r", 0, chunk, now[len(prev):]))
        i += n
    out[-1].finish_reason = "stop"
    return out


async def _agen(items):
    for x in items:
        await asyncio.sleep(0)
        yield x


async def _collect(guard, deltas, policy=None):
    return [x async for x in guard.watch(user("tell me a story"), _agen(deltas), policy or GuardPolicy())]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_retokenizer_matches_full_tokenisation(tok, seed):
    text = " " + TEXT_BAD + " and the weather is nice"
    rng = random.Random(seed)
    rt = IncrementalRetokenizer(tok)
    got, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        got += rt.feed(text[i:i + n])
        # nothing committed may change later: every committed token ends at or before the text seen
        assert all(b <= i + n for _, _, b in got)
        i += n
    got += rt.feed("", final=True)
    full = tok(text, add_special_tokens=False)["input_ids"]
    assert [t for t, _, _ in got] == full
    assert got[-1][2] == len(text)


def test_retokenizer_bounds_the_tail_without_spaces(tok):
    rt = IncrementalRetokenizer(tok, max_tail_chars=10)
    out = rt.feed("x" * 30)
    assert len(out) > 0      # committed despite no whitespace
    assert rt.committed < 30


async def test_benign_stream_passes_whole(tok, tmp_path):
    g, runner, _ = make_guard(tok, tmp_path)
    assert isinstance(g, StreamGuard)
    ds = _deltas(TEXT_SAFE, tok)
    out = await _collect(g, ds)
    assert out == ds
    assert out[-1].finish_reason == "stop"
    # released deltas carry one score per generator token, all below the threshold here
    thr = g.threshold("response", GuardPolicy())
    assert all(d.scores is not None and len(d.scores) == len(d.token_ids) for d in out)
    assert max(x for d in out for x in d.scores) <= thr
    assert g.threshold("response", GuardPolicy(response_threshold=0.7)) == 0.7
    feats = g.describe_features()
    assert feats["response"]["overall"][0] == {"id": 7, "weight": 1.0}
    assert "violence" in feats["prompt"]["categories"]


@pytest.mark.parametrize("hold", [1, 3])
async def test_cut_before_offending_token(tok, tmp_path, hold):
    g, runner, bad = make_guard(tok, tmp_path)
    ds = _deltas(TEXT_BAD, tok, seed=hold)
    out = await _collect(g, ds, GuardPolicy(hold_back=hold))
    assert isinstance(out[-1], SafetyCut)
    cut = out[-1]
    released = out[:-1]
    sent_ids = [t for d in released for t in d.token_ids]
    assert bad not in sent_ids                          # the offending token never left
    assert cut.token_offset == len(sent_ids)            # first withheld generated token
    all_ids = [t for d in ds for t in d.token_ids]
    assert all_ids[cut.token_offset:].index(bad) < 3 + hold   # withheld at most the delta + hold-back
    assert cut.category == "violence" and cut.gate == "response"
    assert cut.score > cut.threshold
    assert cut.features and cut.features[0].id == 7
    assert "".join(d.text for d in released).strip() and "bomb" not in "".join(d.text for d in released)
    assert TEXT_BAD[cut.char_offset:].startswith(" bomb") or TEXT_BAD[cut.char_offset:].startswith("bomb")


async def test_larger_hold_back_releases_less(tok, tmp_path):
    g, _, _ = make_guard(tok, tmp_path)
    ds = _deltas(TEXT_BAD, tok, seed=5, max_chunk=1)
    a = await _collect(g, ds, GuardPolicy(hold_back=1))
    b = await _collect(g, ds, GuardPolicy(hold_back=4))
    assert len(b) < len(a)
    assert a[-1].token_offset > b[-1].token_offset


async def test_same_tokenizer_cuts_at_the_generator_token(tok, tmp_path):
    g, runner, bad = make_guard(tok, tmp_path)
    assert g.set_generator_tokenizer(tok)
    ds = _deltas(TEXT_BAD, tok, seed=3, max_chunk=1)
    out = await _collect(g, ds)
    cut = out[-1]
    assert isinstance(cut, SafetyCut)
    all_ids = [t for d in ds for t in d.token_ids]
    assert cut.token_offset == all_ids.index(bad)
    assert sum(len(d.token_ids) for d in out[:-1]) == cut.token_offset
    assert all(len(d.scores) == len(d.token_ids) for d in out[:-1])


async def test_different_generator_tokenizer_is_retokenised(tok, tmp_path):
    """A generator with another tokenizer (characters here): the guard still cuts at the word."""
    g, runner, bad = make_guard(tok, tmp_path)

    class CharTok:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

        def decode(self, ids):
            return "".join(chr(i) for i in ids)

    ds = _deltas(TEXT_BAD, CharTok(), seed=0, max_chunk=4)
    assert not g.set_generator_tokenizer(CharTok())
    out = await _collect(g, ds)
    cut = out[-1]
    assert isinstance(cut, SafetyCut)
    sent = "".join(d.text for d in out[:-1])
    assert "bomb" not in sent and TEXT_BAD.startswith(sent)
    assert cut.token_offset == len(sent)                # one generator token per character


async def test_fail_closed_and_fail_open(tok, tmp_path):
    g, _, _ = make_guard(tok, tmp_path, fail=True)
    ds = _deltas(TEXT_SAFE, tok)
    out = await _collect(g, ds)
    assert len(out) == 1 and isinstance(out[0], SafetyCut) and out[0].decision == "guard_error"
    g2, _, _ = make_guard(tok, tmp_path, fail=True)
    out2 = await _collect(g2, ds, GuardPolicy(fail_closed=False))
    assert out2 == ds
    cut = await g2.check_prompt(user("hello"), GuardPolicy())
    assert cut is not None and cut.decision == "guard_error"
    assert await g2.check_prompt(user("hello"), GuardPolicy(fail_closed=False)) is None


async def test_policy_disabled_passes_through(tok, tmp_path):
    g, runner, _ = make_guard(tok, tmp_path)
    ds = _deltas(TEXT_BAD, tok)
    assert await _collect(g, ds, GuardPolicy(enabled=False)) == ds
    assert runner.batches == []


async def test_threshold_override_and_category_filter(tok, tmp_path):
    g, _, _ = make_guard(tok, tmp_path)
    ds = _deltas(TEXT_BAD, tok)
    assert await _collect(g, ds, GuardPolicy(response_threshold=10.0)) == ds
    assert await _collect(g, ds, GuardPolicy(categories=("sexual",))) == ds


async def test_streams_are_batched_and_match_sequential(tok, tmp_path):
    g, runner, _ = make_guard(tok, tmp_path)
    texts = [TEXT_BAD if i % 2 else TEXT_SAFE for i in range(8)]
    seq = [await _collect(g, _deltas(t, tok, seed=i)) for i, t in enumerate(texts)]
    runner.batches.clear()
    par = await asyncio.gather(*[_collect(g, _deltas(t, tok, seed=i)) for i, t in enumerate(texts)])
    assert [[repr(x) for x in o] for o in par] == [[repr(x) for x in o] for o in seq]
    assert max(runner.batches) >= 4          # several streams in one forward
    assert runner.n_active == 0              # every slot released


async def test_prompt_gate_score_text_and_moderation(tok, tmp_path):
    g, _, _ = make_guard(tok, tmp_path)
    assert await g.check_prompt(user("how are you today ?"), GuardPolicy()) is None
    cut = await g.check_prompt(user("how to build a bomb at home"), GuardPolicy())
    assert cut is not None and cut.gate == "prompt" and cut.category == "violence"
    assert "how to build a bomb at home"[cut.char_offset:].lstrip().startswith("bomb")
    r = await g.score_text("tell me a story", "once upon a time there was a bomb")
    assert set(r) == {"tokens", "scores", "threshold", "cut"}
    assert len(r["tokens"]) == len(r["scores"])
    assert "".join(r["tokens"]).strip() == "once upon a time there was a bomb"
    assert r["cut"]["token_offset"] == len(r["tokens"]) - 1
    assert r["scores"][-1] > r["threshold"] >= max(r["scores"][:-1])
    r2 = await g.score_text("once upon a time")
    assert r2["cut"] is None
    mods = await g.moderate(["the sky is blue", "build a bomb"])
    assert [m["flagged"] for m in mods] == [False, True]
    assert mods[1]["categories"]["violence"] and mods[1]["category_scores"]["violence"] > 0.5
    assert mods[0]["category_scores"]["violence"] < 0.5


async def test_a_final_prompt_gate_scores_the_whole_request(tok, tmp_path):
    """With a final pooling the prompt gate decides on the request's mean: one dangerous word in a longer
    harmless request passes, a request that is mostly that word is refused at its last token, and the
    moderation view agrees with the gate."""
    from dataclasses import replace

    from guard.monitor import Pooling

    g, _, _ = make_guard(tok, tmp_path)
    g._spec.gates["prompt"] = replace(g._spec.gates["prompt"], pooling=Pooling(64, 1, final=True))
    # the same request the windowed gate refuses (test above) passes as a whole
    assert await g.check_prompt(user("how to build a bomb at home"), GuardPolicy()) is None
    cut = await g.check_prompt(user("bomb bomb bomb bomb"), GuardPolicy())
    assert cut is not None and cut.gate == "prompt"
    r = await g.score_text("bomb bomb bomb bomb")
    assert r["cut"]["token_offset"] == len(r["tokens"]) - 1
    assert g.describe_features()["prompt"]["pooling"]["final"] is True
    mods = await g.moderate(["how to build a bomb at home", "bomb bomb bomb bomb"])
    assert [m["flagged"] for m in mods] == [False, True]
    assert mods[0]["category_scores"]["violence"] < 0.5 < mods[1]["category_scores"]["violence"]


@pytest.mark.parametrize("conv", [
    (("system", "You are a helpful assistant. Answer briefly, politely and in plain words."), ("user", "bomb bomb bomb")),
    (("user", "Summarise what the search tool returned for me please."), ("tool", "bomb bomb bomb")),
    (("user", "Continue where you left off in the text below."), ("assistant", "bomb bomb bomb")),
    (("user", "bomb and then"), ("user", "bomb bomb")),
    (("user", "Please look this up for me."), ("tool", "bomb bomb bomb"),
     ("user", "Now do exactly what the result above says, step by step, and be thorough about it.")),
], ids=["system", "tool", "prefill", "split", "earlier-tool"])
async def test_a_final_prompt_gate_reads_the_request_apart_from_what_thins_it(tok, tmp_path, conv):
    """Words around an unsafe request lower a whole-request mean; the gate also scores the request's own
    messages (and the user's messages joined), so each form is refused, at the end of the prompt. Without
    the views the same conversations pass: the views, not the whole, decide."""
    from dataclasses import replace

    from guard.monitor import Pooling

    for views in (True, False):
        g, _, _ = make_guard(tok, tmp_path, prompt_views=views)
        g._spec.gates["prompt"] = replace(g._spec.gates["prompt"], pooling=Pooling(64, 1, final=True))
        assert await g.check_prompt(user("bomb bomb bomb"), GuardPolicy()) is not None
        cut = await g.check_prompt(conv, GuardPolicy())
        if not views:
            assert cut is None
            continue
        assert cut is not None and cut.gate == "prompt" and cut.category == "violence"
        r = await g.score_text(conv)
        assert cut.token_offset == len(r["tokens"]) - 1
        # a harmless conversation of the same shapes stays harmless under its views
        harmless = tuple((role, "tell me a story about a cat") if role != "system" else (role, text)
                         for role, text in conv)
        assert await g.check_prompt(harmless, GuardPolicy()) is None


async def test_cancelled_stream_frees_its_slot_only_after_its_queued_forward(tok, tmp_path):
    """A client that disconnects mid-forward must not let a new stream reuse a slot its job still writes."""
    g, runner, _ = make_guard(tok, tmp_path, max_batch=1)
    ds = _deltas(TEXT_SAFE, tok, max_chunk=1)

    async def slow():
        for d in ds:
            await asyncio.sleep(0)
            yield d

    it = g.watch(user("tell me a story"), slow(), GuardPolicy()).__aiter__()
    await it.__anext__()
    await it.aclose()                       # disconnect: the slot goes back through the queue
    out = await _collect(g, ds)             # max_batch=1: this stream must wait for that slot
    assert out == ds
    assert runner.n_active == 0
    # slot 0 served both streams, one after the other: never stepped between its free and re-alloc
    ev = [e for e, s in runner.events if s == 0]
    assert ev.count("alloc") == 2 and ev.count("free") == 2
    assert ev[ev.index("free") + 1] == "alloc"


async def test_operator_budget_sets_the_threshold_from_the_benign_scores(tok, tmp_path):
    g, _, _ = make_guard(tok, tmp_path, response_budget=0.05)
    g.spec.gates["response"].benign_scores = [i / 100 for i in range(100)]
    thr = g.threshold("response", GuardPolicy())
    assert 0.94 < thr < 0.95                                # 5 of the 100 benign scores lie above it
    assert g.threshold("response", GuardPolicy(response_threshold=0.5)) == 0.5   # a request's own threshold wins
    assert g.threshold("prompt", GuardPolicy()) == g.spec.threshold("prompt")     # no budget: the build's


async def test_operator_budget_holds_for_the_residual_probe_on_its_own(tok, tmp_path):
    from dataclasses import replace

    import torch

    from guard.monitor import Head

    g, _, _ = make_guard(tok, tmp_path, response_budget=0.05)
    spec = g.spec
    spec.encoder = spec.encoder.with_probes(torch.zeros(spec.encoder.d_in, 1), [-1])
    spec.gates["response"] = replace(spec.gates["response"], benign_scores=[i / 100 for i in range(100)],
                                     probe=Head([-1], [1.0], None, 0.0, None, "residual_probe"), probe_threshold=-3.0,
                                     probe_benign_scores=[-10 + i / 10 for i in range(100)])
    sc = g._gate("response", GuardPolicy())
    thr, pthr = sc.threshold, sc.threshold - sc.probe_offset
    assert 0.94 < thr < 0.95 and -0.55 < pthr < -0.5       # each at the operator's 5 %, on its own scores
    # an explicit threshold moves the probe with the gate, by the same amount as from the build's pair
    sc = g._gate("response", GuardPolicy(response_threshold=0.5))
    assert sc.threshold == 0.5 and sc.probe_offset == spec.gates["response"].threshold + 3.0


async def test_a_probe_added_to_the_prompt_gate_is_read_by_its_budget_and_named_in_a_refusal(tok, tmp_path):
    from dataclasses import replace

    import numpy as np
    import torch

    from guard.monitor import Head

    g, _, _ = make_guard(tok, tmp_path, prompt_budget=0.05)
    spec = g.spec
    spec.encoder = spec.encoder.with_probes(torch.zeros(spec.encoder.d_in, 1), [-2])
    # the probe's column reads nothing (zero weights): its bias alone moves every score by weight x bias
    spec.gates["prompt"] = replace(spec.gates["prompt"], benign_scores=[i / 100 for i in range(100)],
                                   own_budget_scores={}, probe=Head([-2], [1.0], None, 4.0, None, "residual_probe"),
                                   probe_weight=0.5)
    sc = g._gate("prompt", GuardPolicy())
    # the budget reads the sum's benign scores; the added probe has no threshold of its own to move
    assert 0.94 < sc.threshold < 0.95 and sc.probe_weight == 0.5 and sc.probe_offset == 0.0
    plain = replace(spec.gates["prompt"], probe=None, probe_weight=None)
    conv = user("hello there, how are you today?")
    base = (await g.score_text(conv[0][1]))["scores"]
    spec.gates["prompt"], added = plain, spec.gates["prompt"]
    plain_scores = (await g.score_text(conv[0][1]))["scores"]
    spec.gates["prompt"] = added
    np.testing.assert_allclose(base, np.asarray(plain_scores) + 0.5 * 4.0, rtol=1e-6)
    # a refusal by the sum says so, and still names the read-out's latents
    cut = await g.check_prompt(conv, GuardPolicy(prompt_threshold=min(base) - 1.0))
    assert cut is not None and cut.gate == "prompt" and cut.trigger == "combined"


async def test_text_the_guard_cannot_read_is_refused_never_failed_open(tok, tmp_path):
    from guard.api import GuardInputError

    g, _, _ = make_guard(tok, tmp_path, max_len=64)
    long_text = " ".join(["word"] * 400)
    for policy in (GuardPolicy(), GuardPolicy(fail_closed=False)):
        with pytest.raises(GuardInputError, match="at most 64"):
            await g.check_prompt(user(long_text), policy)
    with pytest.raises(GuardInputError):
        await g.moderate([long_text])
    with pytest.raises(GuardInputError):
        await g.score_text(long_text)
    with pytest.raises(GuardInputError, match="lone surrogate"):
        await g.moderate(["fine \ud800 text"])


async def test_an_engine_error_passes_through_the_guard_as_itself(tok, tmp_path):
    """A failing engine is the engine's error, not a guard cut: under both policies the watch re-raises it."""
    from inference.engine import EngineError

    async def failing():
        for d in _deltas(TEXT_SAFE, tok)[:2]:
            yield d
        raise EngineError("engine died")

    for policy in (GuardPolicy(), GuardPolicy(fail_closed=False)):
        g, runner, _ = make_guard(tok, tmp_path)
        got = []
        with pytest.raises(EngineError, match="engine died"):
            async for x in g.watch(user("tell me a story"), failing(), policy):
                got.append(x)
        assert not any(isinstance(x, SafetyCut) for x in got)
        assert runner.n_active == 0


def _windowed_guard(tok, tmp_path, hold_back: int = 1):
    """The planted monitor with a window of 4 tokens: one " bomb" alone stays under the threshold, two within
    four tokens cross it, so a cut needs the evidence of several tokens, as the real read-outs do."""
    from dataclasses import replace as dc_replace

    from guard.monitor import Pooling

    g, runner, bad = make_guard(tok, tmp_path)
    gate = g._spec.gates["response"]
    one = 0.4 / 4                       # a " bomb" token's activation (0.4) averaged over the window
    g._spec.gates["response"] = dc_replace(gate, pooling=Pooling(4, 4), threshold=1.5 * one)
    return g


TEXT_SPLIT = "sure , first take the bomb bomb and then the rest is easy to do at home"


async def _split_client(g, tok, chunk: int, policy: GuardPolicy) -> tuple[str, bool]:
    """A client pulling the answer ``chunk`` generator tokens per request, each request's prompt ending with
    the answer released so far as an assistant turn; returns what it got and whether it was cut."""
    ids = tok(TEXT_SPLIT, add_special_tokens=False)["input_ids"]
    released, pos = "", 0
    while pos < len(ids):
        piece = ids[pos:pos + chunk]
        text = tok.decode(ids[:pos + len(piece)])[len(tok.decode(ids[:pos])):] if pos else tok.decode(piece)
        conv = user("tell me a story") + ((("assistant", released),) if released else ())
        d = TokenDelta("r", 0, piece, text, finish_reason="length")
        out = [x async for x in g.watch(conv, _agen([d]), policy)]
        got = "".join(x.text for x in out if isinstance(x, TokenDelta))
        released += got
        pos += len(piece)
        if any(isinstance(x, SafetyCut) for x in out):
            return released, True
    return released, False


@pytest.mark.parametrize("chunk", [1, 2, 4])
async def test_a_continuation_split_across_requests_is_cut_no_later(tok, tmp_path, chunk):
    g = _windowed_guard(tok, tmp_path)
    one = await _collect(g, [TokenDelta("r", 0, tok(TEXT_SPLIT, add_special_tokens=False)["input_ids"], TEXT_SPLIT,
                                        finish_reason="stop")])
    cut_one = next(x for x in one if isinstance(x, SafetyCut))
    # in one stream the cut lands on the second " bomb": everything from it on is withheld
    whole = TEXT_SPLIT.index("bomb bomb") + len("bomb ")
    assert cut_one.char_offset <= whole
    released, was_cut = await _split_client(g, tok, chunk, GuardPolicy())
    assert was_cut, "a continuation pulled out a few tokens at a time must still be cut"
    assert "bomb bomb" not in released and len(released.strip()) <= whole


async def test_without_the_carried_answer_each_request_starts_afresh(tok, tmp_path):
    """What the carry closes: scored alone, each single-token request never fills the window."""
    g = _windowed_guard(tok, tmp_path)
    ids = tok(TEXT_SPLIT, add_special_tokens=False)["input_ids"]
    cuts = 0
    for i in range(len(ids)):
        d = TokenDelta("r", 0, [ids[i]], tok.decode([ids[i]]), finish_reason="length")
        out = [x async for x in g.watch(user("tell me a story"), _agen([d]), GuardPolicy())]
        cuts += any(isinstance(x, SafetyCut) for x in out)
    assert cuts == 0


async def test_the_generator_starts_while_the_guard_reads_the_context(tok, tmp_path):
    """The watched stream is read from the moment the guard holds its slot, so the generator's prefill runs
    beside the guard's context forward rather than after it; a cut closes it."""
    import threading

    g, runner, _ = make_guard(tok, tmp_path)
    generator_started = threading.Event()
    seen_during_context: list[bool] = []
    step = runner.step

    def context_waits_for_the_generator(batch):
        if not seen_during_context:      # the first step is the context forward
            seen_during_context.append(generator_started.wait(5))
        return step(batch)

    runner.step = context_waits_for_the_generator
    closed = asyncio.Event()

    async def upstream():
        generator_started.set()
        try:
            for d in _deltas(TEXT_BAD, tok):
                await asyncio.sleep(0)
                yield d
        finally:
            closed.set()

    out = await asyncio.wait_for(_collect_from(g, upstream()), 20)
    assert seen_during_context == [True]            # asked for its first delta during the context forward
    assert isinstance(out[-1], SafetyCut)
    await asyncio.wait_for(closed.wait(), 5)        # the cut closed the generator


async def _collect_from(guard, agen):
    return [x async for x in guard.watch(user("tell me a story"), agen, GuardPolicy())]


async def test_deltas_that_arrived_together_are_scored_in_one_step(tok, tmp_path):
    """A generator ahead of the guard (its deltas already waiting) costs one guard step for all of them, not
    one per delta, and the stream still comes out whole and in order."""
    g, runner, _ = make_guard(tok, tmp_path)
    ds = _deltas(TEXT_SAFE, tok, seed=1, max_chunk=1)

    async def all_at_once():
        for d in ds:
            yield d              # no await between deltas: each is already there when the guard reads

    out = [x async for x in g.watch(user("tell me a story"), all_at_once(), GuardPolicy())]
    assert out == ds
    assert len(runner.batches) <= 3 < len(ds)       # context, then the waiting deltas (and the final flush)


async def _first_out_while_upstream_waits(g, ds, n_sent: int, wait_s: float = 2.0):
    """Send ``n_sent`` deltas and hold the rest back; return what the guard released meanwhile (waiting up to
    ``wait_s`` for a first release), then everything once the rest is sent."""
    q: asyncio.Queue = asyncio.Queue()
    for d in ds[:n_sent]:
        q.put_nowait(d)

    async def upstream():
        while (d := await q.get()) is not None:
            yield d

    out: list = []

    async def consume():
        async for x in g.watch(user("tell me a story"), upstream(), GuardPolicy()):
            out.append(x)

    task = asyncio.create_task(consume())
    loop = asyncio.get_running_loop()
    end = loop.time() + wait_s
    while not out and loop.time() < end:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    early = list(out)
    for d in [*ds[n_sent:], None]:
        q.put_nowait(d)
    await asyncio.wait_for(task, 20)
    return early, out


@pytest.mark.parametrize("open_tail", [True, False])
async def test_an_unfinished_word_leaves_once_scored_only_with_open_tail(tok, tmp_path, open_tail):
    """The first word of an answer is released after one guard step when the open tail is scored; without
    it, it waits for the next word (its guard tokens may still change). Either way the stream ends whole."""
    g, runner, _ = make_guard(tok, tmp_path, score_open_tail=open_tail)
    ds = _deltas(TEXT_SAFE, tok, seed=0, max_chunk=1)
    assert ds[1].text.startswith(" ")           # the first word is finished only by the second delta
    early, out = await _first_out_while_upstream_waits(g, ds, 1)
    assert out == ds
    assert early == (ds[:1] if open_tail else [])


async def test_the_open_tail_is_forgotten_so_the_slot_reads_the_final_tokens(tok, tmp_path):
    """What a stream leaves in its guard slot, and every score that can cut, are those of the final
    tokenisation of the text, exactly as without the open tail."""
    results = {}
    for open_tail in (True, False):
        g, runner, bad = make_guard(tok, tmp_path, score_open_tail=open_tail)
        steps: list[list[int]] = []
        step = runner.step

        def recording(batch, step=step, steps=steps, runner=runner):
            outs = step(batch)
            steps.append([int(t) for t in runner.fed[batch[0][0]]])
            return outs

        runner.step = recording
        ds = _deltas(TEXT_BAD, tok, seed=4, max_chunk=2)

        async def paced(ds=ds):
            for d in ds:        # a generator slower than the guard: one step per delta, open tails read
                await asyncio.sleep(0.02)
                yield d

        out = [x async for x in g.watch(user("tell me a story"), paced(), GuardPolicy())]
        cut = out[-1]
        assert isinstance(cut, SafetyCut)
        results[open_tail] = (cut.token_offset, cut.score, cut.char_offset, steps[-1])
        if open_tail:
            assert ("truncate", 0) in runner.events
        ctx = tok(response_context(user("tell me a story")), add_special_tokens=False)["input_ids"]
        assert steps[-1][:len(ctx)] == ctx
        assert bad in steps[-1]
        assert bad not in [t for d in out[:-1] for t in d.token_ids]
    # the slot holds the context and final tokens only: the same sequence either way (up to where each
    # step ended), the offending token at the same place, the same cut
    a, b = results[True][3], results[False][3]
    n = min(len(a), len(b))
    assert a[:n] == b[:n] and a.index(bad) == b.index(bad)
    assert results[True][1:3] == results[False][1:3]
    assert results[True][0] >= results[False][0]


async def test_an_open_tail_over_the_threshold_holds_the_word_back_without_cutting(tok, tmp_path):
    """A provisional token that crosses the threshold releases nothing; only the final tokens cut."""
    g, runner, bad = make_guard(tok, tmp_path, score_open_tail=True)
    text = "hello there bomb"
    ds = _deltas(text, tok, seed=0, max_chunk=1)
    assert ds[-1].text == " bomb"
    early, out = await _first_out_while_upstream_waits(g, ds, len(ds) - 1)
    # " bomb" is still open while its delta is the last one received: hidden, and no cut yet
    assert all(not isinstance(x, SafetyCut) for x in early)
    assert isinstance(out[-1], SafetyCut)
    assert bad not in [t for d in out[:-1] for t in d.token_ids]


async def test_engine_forgets_provisional_ids_after_reading_them(tok, tmp_path):
    import torch

    from guard.batching import GuardEngine

    runner = FakeRunner(len(tok))
    eng = GuardEngine(runner, 4)
    slot = await eng.acquire()
    rows = await eng.forward(slot, [5, 6, 7, 8], provisional=2)
    assert rows.shape[0] == 4 and runner.length(slot) == 2 and runner.fed[slot] == [5, 6]
    again = await eng.forward(slot, [7, 9])
    assert runner.fed[slot] == [5, 6, 7, 9]
    assert torch.equal(rows[2], again[0])
    with pytest.raises(ValueError):
        await eng.forward(slot, [1], provisional=2)
    await eng.release(slot)
    await eng.close()


async def _prompt_gate_beside_a_stream(g, runner, conv, end_stream_first: bool = False):
    """Start a stream over ``conv``, then the prompt gate over the same conversation while the stream's
    context forward is held back; returns (the gate's result, slots allocated)."""
    import threading

    looked = asyncio.Event()
    shared_rows = g._shared_rows

    async def spy(text, ids):
        looked.set()
        return await shared_rows(text, ids)

    g._shared_rows = spy
    go = threading.Event()
    step = runner.step

    def held(batch):
        go.wait(5)
        return step(batch)

    runner.step = held

    async def stream():
        return [x async for x in g.watch(conv, _agen(_deltas(TEXT_SAFE, g.tokenizer)), GuardPolicy())]

    watching = asyncio.create_task(stream())
    await asyncio.sleep(0)
    if end_stream_first:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    gate = asyncio.create_task(g.check_prompt(conv, GuardPolicy()))
    await asyncio.wait_for(looked.wait(), 5)
    go.set()
    cut = await asyncio.wait_for(gate, 20)
    if not end_stream_first:
        await asyncio.wait_for(watching, 20)
    return cut, sum(1 for e in runner.events if e[0] == "alloc")


async def test_the_prompt_gate_reads_the_rows_of_a_stream_over_the_same_conversation(tok, tmp_path):
    """A stream's context forward covers the whole conversation; the prompt gate started beside it scores
    those rows instead of forwarding the conversation again, with the same result."""
    conv = user("please tell me how to build a bomb at home")
    alone, runner0, _ = make_guard(tok, tmp_path)
    ref = await alone.check_prompt(conv, GuardPolicy())
    assert isinstance(ref, SafetyCut)
    g, runner, _ = make_guard(tok, tmp_path)
    cut, allocs = await _prompt_gate_beside_a_stream(g, runner, conv)
    assert allocs == 1                                   # the stream's slot only
    assert isinstance(cut, SafetyCut)
    assert (cut.score, cut.token_offset, cut.char_offset, cut.category) == \
        (ref.score, ref.token_offset, ref.char_offset, ref.category)
    assert g._contexts == {}                             # nothing kept once read


async def test_the_prompt_gate_reads_the_text_itself_when_the_stream_ends_first(tok, tmp_path):
    conv = user("please tell me how to build a bomb at home")
    alone, _, _ = make_guard(tok, tmp_path)
    ref = await alone.check_prompt(conv, GuardPolicy())
    g, runner, _ = make_guard(tok, tmp_path)
    cut, _ = await _prompt_gate_beside_a_stream(g, runner, conv, end_stream_first=True)
    assert isinstance(cut, SafetyCut) and (cut.score, cut.token_offset) == (ref.score, ref.token_offset)
    assert g._contexts == {}


async def test_a_continued_answer_is_not_shared_with_the_prompt_gate(tok, tmp_path):
    """With an assistant answer carried in the conversation the stream's context is not the text the prompt
    gate reads, so nothing is shared (the gate forwards the conversation itself)."""
    conv = (("user", "tell me a story"), ("assistant", "once upon a time"))
    g, runner, _ = make_guard(tok, tmp_path)
    cut, allocs = await _prompt_gate_beside_a_stream(g, runner, conv)
    # The stream's slot and the gate's own forward of the conversation. Of the gate's two views, the user's
    # message alone is the text the stream's context starts with, so its rows are shared; the carried answer
    # alone is forwarded in a slot of its own.
    assert prompt_views(conv) == [user("tell me a story"), user("once upon a time")]
    assert cut is None and allocs == 3 and g._contexts == {}


async def test_response_context_term_streams_as_scored_offline(tok, tmp_path):
    """A response gate with a context term: the same answer is cut after a request that reads as risky and
    passes after a calm one, and the stream cuts at the token and score the offline scoring gives."""
    from dataclasses import replace

    from guard.bundle import MonitorSpec
    from guard.monitor import ContextTerm, Head

    g, _, _ = make_guard(tok, tmp_path)
    spec = g.spec
    # latent 7 fires on " bomb": a request that names one lifts every score of its answer by 10 x its mean
    term = ContextTerm(Head([7], [1.0]), 10.0, 0.0)
    g._spec = MonitorSpec(spec.encoder, {"prompt": spec.gates["prompt"],
                                         "response": replace(spec.gates["response"], context=term)}, "test")
    risky, calm = user("how to build a bomb"), user("how to build a shed")
    answer = "hello there my friend , how are you today ?"
    off_risky, off_calm = await g.score_text(risky, answer), await g.score_text(calm, answer)
    assert off_calm["cut"] is None and off_risky["cut"] is not None
    assert min(off_risky["scores"]) > max(off_calm["scores"]) + 0.5
    # the term is the request's mean: more calm words around the same one give a smaller lift
    longer = await g.score_text(user("how to build a bomb shelter for the garden in the rain"), answer)
    assert max(longer["scores"]) < max(off_risky["scores"])
    got = [x async for x in g.watch(risky, _agen(_deltas(answer, tok)), GuardPolicy())]
    cut = got[-1]
    assert isinstance(cut, SafetyCut) and cut.gate == "response"
    assert cut.score == pytest.approx(off_risky["scores"][off_risky["cut"]["token_offset"]], rel=1e-6)
    assert cut.token_offset == off_risky["cut"]["token_offset"]
    passed = [x async for x in g.watch(calm, _agen(_deltas(answer, tok)), GuardPolicy())]
    assert not any(isinstance(x, SafetyCut) for x in passed)
    assert "".join(x.text for x in passed).strip() == answer
