"""Shared test doubles for the guard: a tiny BPE tokenizer and a fake runner whose "residual" for a
token is a fixed embedding, so a planted SAE latent fires on chosen tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

CORPUS = [
    "hello there my friend , how are you today ?",
    "the weather is nice and the sky is blue",
    "here is how to build a bomb at home quickly",
    "I like cooking pasta with tomato sauce",
    "User: tell me a story\nAssistant: once upon a time there was a bomb",
]


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="</s>", pad_token="</s>")


class FakeRunner:
    """SlotRunner-compatible double: residual(token) = E[token]; records every step's batch size."""

    def __init__(self, vocab: int, d: int = 64, max_slots: int = 16, seed: int = 0, fail: bool = False) -> None:
        g = torch.Generator().manual_seed(seed)
        self.E = torch.randn(vocab, d, generator=g)
        self.max_slots = max_slots
        self._lens: dict[int, int] = {}
        self.batches: list[int] = []
        self.events: list[tuple[str, int]] = []     # ("alloc"|"step"|"free", slot), in order
        self.fed: dict[int, list[int]] = {}        # every id stepped into a slot since its last alloc
        self.fail = fail

    def alloc(self) -> int:
        for i in range(self.max_slots):
            if i not in self._lens:
                self._lens[i] = 0
                self.fed[i] = []
                self.events.append(("alloc", i))
                return i
        raise RuntimeError("busy")

    def free(self, slot: int) -> None:
        self._lens.pop(slot, None)
        self.events.append(("free", slot))

    def length(self, slot: int) -> int:
        return self._lens[slot]

    def truncate(self, slot: int, n: int) -> None:
        assert 0 <= n <= self._lens[slot]
        self._lens[slot] -= n
        del self.fed[slot][len(self.fed[slot]) - n:]
        self.events.append(("truncate", slot))

    @property
    def n_active(self) -> int:
        return len(self._lens)

    def step(self, batch):
        if self.fail:
            raise RuntimeError("boom")
        self.batches.append(len(batch))
        out = []
        for s, ids in batch:
            assert s in self._lens, f"step on freed slot {s}"
            self.events.append(("step", s))
            self._lens[s] += len(ids)
            self.fed[s].extend(int(t) for t in ids)
            out.append(self.E[torch.tensor(list(ids), dtype=torch.long)].clone())
        return out


@pytest.fixture(scope="session")
def tok():
    return tiny_tokenizer()


def planted_spec(tok, E: torch.Tensor, bad_word: str = " bomb", threshold: float = 0.2):
    """A MonitorSpec whose one latent fires on the guard token(s) of ``bad_word`` (window 1: a token's own
    activation is its score)."""
    from guard.bundle import GateSpec, MonitorSpec
    from guard.monitor import Head, Pooling
    from guard.sae import SelectedEncoder

    bad = tok(bad_word, add_special_tokens=False)["input_ids"]
    assert len(bad) == 1, bad
    e = E[bad[0]]
    W = torch.stack([e / e.dot(e), -e / e.dot(e)], dim=1)      # latent 7 fires on "bomb", latent 9 never
    enc = SelectedEncoder(ids=[7, 9], W=W, b=torch.tensor([-0.6, -0.6]), b_dec=torch.zeros(E.shape[1]),
                          threshold=torch.zeros(2))
    gate = GateSpec(Head([7, 9], [1.0, 0.5]), Pooling(1, 1), threshold,
                    {"violence": Head([7], [1.0], category="violence")}, {"violence": threshold})
    return MonitorSpec(enc, {"prompt": gate, "response": gate}, "test"), bad[0]


def make_guard(tok, tmp_path, fail=False, max_batch=16, **settings):
    from guard.batching import GuardEngine
    from guard.config import GuardSettings
    from guard.service import NextGuard

    runner = FakeRunner(len(tok), fail=fail, max_slots=max_batch)
    spec, bad = planted_spec(tok, runner.E)
    s = GuardSettings(enabled=False, artifacts_dir=tmp_path, max_batch=max_batch, **settings)
    g = NextGuard(s, model=object(), tokenizer=tok, layer=0, spec=spec)
    g._engine = GuardEngine(runner, max_batch, readout=g.readout)      # inject the double instead of load()
    return g, runner, bad


def np_seed():
    np.random.seed(0)
