"""The batched slot runner equals HF's hidden states, incrementally and with ragged batches."""

from __future__ import annotations

import pytest
import torch

from guard.runner import HFRunner, SlotRunner, collect_residuals


def _tiny(model_type: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    torch.manual_seed(0)
    kw = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
    cfg = LlamaConfig(**kw) if model_type == "llama" else Qwen3Config(head_dim=16, **kw)
    return AutoModelForCausalLM.from_config(cfg).eval()


def _hf_resid(model, ids, layer):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[layer + 1][0]


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_slot_runner_matches_hf_incremental_and_batched(model_type):
    model = _tiny(model_type)
    L = 2
    r = SlotRunner(model, L, max_slots=4, init_len=8)   # small init_len: exercises cache growth
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (13, 5, 21)]
    refs = [_hf_resid(model, s, L) for s in seqs]
    slots = [r.alloc() for _ in seqs]
    # prefill different prompt lengths in one ragged batch, then step 1-3 tokens at a time
    pre = [3, 2, 7]
    got = [[] for _ in seqs]
    outs = r.step([(s, seq[:p]) for s, seq, p in zip(slots, seqs, pre, strict=True)])
    for i, o in enumerate(outs):
        got[i].append(o)
    done = list(pre)
    while any(d < len(s) for d, s in zip(done, seqs, strict=True)):
        batch, who = [], []
        for i, (s, seq) in enumerate(zip(slots, seqs, strict=True)):
            if done[i] < len(seq):
                n = 1 + (i + done[i]) % 3
                batch.append((s, seq[done[i]:done[i] + n]))
                who.append(i)
                done[i] = min(len(seq), done[i] + n)
        for i, o in zip(who, r.step(batch), strict=True):
            got[i].append(o)
    for i in range(len(seqs)):
        torch.testing.assert_close(torch.cat(got[i]), refs[i], atol=1e-4, rtol=1e-4)
    assert r.length(slots[2]) == 21
    r.free(slots[1])
    assert r.alloc() == slots[1] and r.length(slots[1]) == 0


def test_non_contiguous_slots_and_collect():
    model = _tiny("llama")
    r = SlotRunner(model, 1, max_slots=4)
    seqs = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    res = collect_residuals(r, seqs, batch_size=2)
    for s, o in zip(seqs, res, strict=True):
        torch.testing.assert_close(o, _hf_resid(model, s, 1), atol=1e-4, rtol=1e-4)
    a, b, c = r.alloc(), r.alloc(), r.alloc()
    r.free(b)
    outs = r.step([(a, seqs[0]), (c, seqs[2])])
    torch.testing.assert_close(outs[1], _hf_resid(model, seqs[2], 1), atol=1e-4, rtol=1e-4)


def test_hf_runner_matches():
    model = _tiny("llama")
    ref = _hf_resid(model, [3, 1, 4, 1, 5, 9], 2)
    r = HFRunner(_tiny("llama"), 2)
    s = r.alloc()
    o = torch.cat(r.step([(s, [3, 1, 4])]) + r.step([(s, [1])]) + r.step([(s, [5, 9])]))
    torch.testing.assert_close(o, ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="HFRunner"):
        SlotRunner(_gemma(), 0)


def _gemma():
    from transformers import AutoModelForCausalLM, Gemma2Config

    return AutoModelForCausalLM.from_config(Gemma2Config(vocab_size=50, hidden_size=32, intermediate_size=48,
                                                         num_hidden_layers=2, num_attention_heads=2,
                                                         num_key_value_heads=1, head_dim=16))


@pytest.mark.parametrize("kind", ["slot", "hf"])
def test_truncated_tokens_are_forgotten(kind):
    """Tokens read and then dropped (an unfinished word) leave no trace: what follows reads as if they had
    never been fed, in a ragged batch beside another slot."""
    model = _tiny("llama")
    r = SlotRunner(model, 2, max_slots=4, init_len=8) if kind == "slot" else HFRunner(_tiny("llama"), 2)
    a, b = r.alloc(), r.alloc()
    first = r.step([(a, [3, 1, 4, 60, 61, 62]), (b, [7, 7])])
    r.truncate(a, 3)
    assert r.length(a) == 3 and r.length(b) == 2
    nxt = r.step([(a, [1, 5, 9]), (b, [8])])
    torch.testing.assert_close(torch.cat([first[0][:3], nxt[0]]), _hf_resid(model, [3, 1, 4, 1, 5, 9], 2),
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat([first[1], nxt[1]]), _hf_resid(model, [7, 7, 8], 2), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        r.truncate(a, 7)


def test_rows_of_very_different_lengths_run_in_separate_forwards():
    """A long context beside 1-token decode rows is not padded onto them: each group's longest row is at
    most twice its shortest, and every row is in exactly one group."""
    from guard.runner import _length_groups

    ns = [1, 90, 1, 1, 20, 2, 88, 3, 1]
    groups = _length_groups(ns)
    assert sorted(i for g in groups for i in g) == list(range(len(ns)))
    assert all(max(ns[i] for i in g) <= 2 * min(ns[i] for i in g) for g in groups)
    assert sorted(sorted(ns[i] for i in g) for g in groups) == [[1, 1, 1, 1, 2], [3], [20], [88, 90]]


@pytest.mark.parametrize("readout", [False, True])
async def test_a_conversation_start_seen_before_is_copied_not_recomputed(readout):
    """A slot whose first forward starts with a cached start copies its keys, values and output rows: its
    rows equal a full forward's, later steps read the copied keys correctly, and the runner computed only
    the new tokens. A start shorter than the cache's minimum, or a different one, is computed in full."""
    from guard.batching import GuardEngine

    model = _tiny("llama")
    L = 2
    runner = SlotRunner(model, L, max_slots=4, init_len=8)
    computed: list[int] = []
    step = runner.step

    def counting(batch):
        computed.append(sum(len(ids) for _, ids in batch))
        return step(batch)

    runner.step = counting
    # with a read-out the engine returns (and caches) its arrays instead of the residual
    fn = (lambda r: (r.numpy(), r.norm(dim=-1).numpy())) if readout else None
    eng = GuardEngine(runner, 4, prefix_cache=2, readout=fn)

    def resid(x):
        return torch.from_numpy(x[0]) if readout else x

    g = torch.Generator().manual_seed(3)
    system = torch.randint(0, 97, (30,), generator=g).tolist()
    a = system + torch.randint(0, 97, (9,), generator=g).tolist()
    b = system + torch.randint(0, 97, (6,), generator=g).tolist()
    s0 = await eng.acquire()
    await eng.forward(s0, a)
    s1 = await eng.acquire()
    rows = await eng.forward(s1, b)
    more = await eng.forward(s1, [5, 7])                 # decoding on after the copied start
    torch.testing.assert_close(torch.cat([resid(rows), resid(more)]), _hf_resid(model, b + [5, 7], L),
                               atol=1e-4, rtol=1e-4)
    if readout:
        assert rows[1].shape == (len(b),)
    assert computed == [len(a), len(b) - 30, 2]
    assert eng.prefix is not None and eng.prefix.hits == 1 and eng.prefix.tokens_reused == 30
    # a different start is computed in full
    s2 = await eng.acquire()
    other = torch.randint(0, 97, (20,), generator=g).tolist()
    torch.testing.assert_close(resid(await eng.forward(s2, other)), _hf_resid(model, other, L), atol=1e-4, rtol=1e-4)
    assert computed[-1] == 20
    await eng.close()
